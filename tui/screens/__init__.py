"""lynxtop."""

from pathlib import Path

# The stylesheet of every screen but the Node view (the other views and the dialogs), read by Textual when the first
# of them opens (their CSS_PATH): the start's stylesheet holds only what its first frame draws (tui/lynxtop.tcss)
VIEWS_CSS = Path(__file__).resolve().parent.parent / "views.tcss"
