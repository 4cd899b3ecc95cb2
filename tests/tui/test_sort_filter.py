"""The GPU table sorted by any column (htop F6/I), and the events filtered, searched and opened (issue 28.4)."""

from __future__ import annotations

from support.tui import make_app, text_of, wait_for

from lynxtop.tui.widgets.gpu_table import GpuTable


async def test_gpu_table_sorts_by_a_column_keeps_its_gpu_and_survives_live_updates(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 40)) as pilot:
        table = app.screen.query_one("#gpus", GpuTable)
        await wait_for(pilot, lambda: table.row_count == 8)
        assert table.order == list(range(8)) and "▲" not in text_of(table)  # GPU order, unmarked
        table.focus()
        await pilot.press("down", "down")
        assert table.selected_gpu == 2
        await pilot.press("s")  # SM activity (60 + index), busiest first
        assert table.order == [7, 6, 5, 4, 3, 2, 1, 0]
        assert table.selected_gpu == 2  # the cursor stays on its GPU, not its row number
        header = text_of(table).splitlines()[0]
        assert "SM act▼" in header and "GPU▲" not in header
        # a live update: GPU 0 becomes the busiest; the sort holds and re-orders by the new readings
        agent.status["gpus"][0]["sm_active_pct"] = 99
        await wait_for(pilot, lambda: table.order[0] == 0)
        assert table.order == [0, 7, 6, 5, 4, 3, 2, 1] and table.selected_gpu == 2
        assert "SM act▼" in text_of(table).splitlines()[0]
        assert str(table.get_row("0")[1]).strip().endswith("99%")  # rows stay keyed by GPU index
        await pilot.press("I")
        assert table.order == [1, 2, 3, 4, 5, 6, 7, 0] and "SM act▲" in text_of(table).splitlines()[0]
        await pilot.press("enter")  # opens the GPU under the cursor, wherever the sort put it
        await wait_for(pilot, lambda: app.current_mode == "gpu")
        assert app.gpu_index == 2


async def test_gpu_sort_puts_missing_readings_last_and_cycles_back_to_index_order(agent):
    agent.status["gpus"][3]["temp_c"] = None
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 40)) as pilot:
        table = app.screen.query_one("#gpus", GpuTable)
        await wait_for(pilot, lambda: table.row_count == 8)
        table.focus()
        keys = [k for k in table._visible_keys()]
        for _ in range(keys.index("temp")):
            await pilot.press("s")
        assert table.sort_key == "temp" and table.order[-1] == 3  # N/A last, descending
        await pilot.press("I")
        assert table.order[-1] == 3 and table.order[:2] == [0, 1]  # ... and ascending
        for _ in range(len(keys) - keys.index("temp")):
            await pilot.press("s")
        assert table.sort_key == "gpu" and table.order == list(range(8))
