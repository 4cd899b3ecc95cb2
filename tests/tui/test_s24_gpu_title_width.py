"""The GPU view's title line at 120 columns with a real 40-character GPU UUID: the demo cut it at
"(8 GPUs; ←/→ to choose;" and lost the window it charts ("last 15 min"). It must fit whole, dropping the long
words (and then the UUID) as the 80-column line does."""

from __future__ import annotations

from rich.cells import cell_len
from support.tui import make_app, text_of, wait_for

REAL_UUID = "GPU-51m00000-c0de-4a11-8b0b-000000000000"  # NVML's form: GPU- and a 36-character UUID


async def test_gpu_title_fits_at_120_columns_with_a_real_uuid(agent):
    for gpu in agent.status["gpus"]:
        gpu["uuid"] = REAL_UUID
        gpu["name"] = "NVIDIA H200 (simulated)"  # what the demo's GPUs are called
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await pilot.press("2")
        await wait_for(pilot, lambda: "GPU 0" in text_of(app.screen.query_one("#gpu-title")))
        widget = app.screen.query_one("#gpu-title")
        full = text_of(widget).strip()
        assert cell_len(full) <= widget.size.width, (full, widget.size.width)
        assert "15 min" in full and "00000000:18:00.0" in full, full


async def test_gpu_title_keeps_the_uuid_where_it_fits(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await pilot.press("2")
        await wait_for(pilot, lambda: "GPU 0" in text_of(app.screen.query_one("#gpu-title")))
        full = text_of(app.screen.query_one("#gpu-title")).strip()
        assert "GPU-fake-0000" in full and "last 15 min" in full, full
