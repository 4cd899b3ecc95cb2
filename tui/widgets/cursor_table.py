"""A row-cursor DataTable whose cursor also moves with j/k, as the Node view's GPU table does."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import DataTable


class CursorTable(DataTable):
    """j/k beside the arrows (vim, htop, k9s): operators who move the GPU table with j/k pressed them in the
    History and Processes lists too and nothing happened. The arrows are re-bound with the same words as the GPU
    table's ("Up"/"Down"), so Help merges each pair into one row ("up, k  Up") as it does on the Node view.
    Only for views that do not bind j or k themselves: the table has the focus, so its keys would shadow them."""

    BINDINGS = [
        Binding("up,k", "cursor_up", "Up", show=False, id="table.up"),
        Binding("down,j", "cursor_down", "Down", show=False, id="table.down"),
    ]
