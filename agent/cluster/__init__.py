"""Multi-node roles: this node's Ray (head or worker), supervised like vLLM, and the head's view of the cluster.

Owns `ray start`/`ray stop`, the cluster view read from Ray's state API over HTTP, and `lynxtop stop --cluster`.
Never imports ray itself.
"""
