"""`cadence.utils.tqdm`: one progress bar per machine, on its local main process, in real processes."""

from __future__ import annotations

import io

import pytest


def draw_bars():
    from cadence.utils import tqdm

    default_output, everywhere_output = io.StringIO(), io.StringIO()
    default = tqdm(range(3), file=default_output, desc="default")
    everywhere = tqdm(range(3), main_process_only=False, file=everywhere_output, desc="everywhere")
    forced_off = tqdm(range(3), main_process_only=False, disable=True, file=io.StringIO())
    shown = {
        "default_shown": not default.disable,
        "everywhere_shown": not everywhere.disable,
        "forced_off_shown": not forced_off.disable,
    }
    for bar in (default, everywhere, forced_off):
        for _ in bar:
            pass
        bar.close()
    return {
        **shown,
        "default_text": default_output.getvalue(),
        "everywhere_text": everywhere_output.getvalue(),
    }


def test_the_bar_shows_on_the_local_main_process_only(dist_pool):
    main, other = dist_pool(2).run(draw_bars)
    assert main["default_shown"] and not other["default_shown"]
    assert "default" in main["default_text"] and "3/3" in main["default_text"]
    assert other["default_text"] == ""
    assert main["everywhere_shown"] and other["everywhere_shown"]
    assert "3/3" in other["everywhere_text"]
    assert not main["forced_off_shown"] and not other["forced_off_shown"]


def test_the_old_positional_flag_is_refused_with_the_keyword_to_use():
    from cadence.utils.tqdm import tqdm

    with pytest.raises(ValueError, match="main_process_only=False"):
        tqdm(True, range(3))
