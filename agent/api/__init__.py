"""The control API and its listeners: routes, the seam to the supervisor, connection limits, peer credentials.

Owns the unix-socket (and optional TCP) servers and request validation; carries out nothing itself: every action
goes through `control.Control` to the serving side. May import the rest of the agent, the store and the contract.
"""
