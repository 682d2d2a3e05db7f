"""JupyterLab through our gateway, in a real browser: the first cell's output shows within seconds.

Against stock Enterprise Gateway 3.3 this took about 100 s (or never came): see the docstring of
jupyter_notebookos.gateway.web.websocket for why.
"""

from __future__ import annotations

import pytest
from lab_stack import Browser, Service, time_first_output

FIRST_OUTPUT_BOUND_S = 10.0


@pytest.mark.browser
def test_new_notebook_shows_first_output_within_seconds(
    browser: Browser, lab: Service, notebookos_gateway: Service
) -> None:
    try:
        seconds = time_first_output(browser, lab, expected="2", timeout=3 * FIRST_OUTPUT_BOUND_S)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n--- gateway log ---\n{notebookos_gateway.log_text()[-4000:]}")
    print(f"first output in the browser {seconds:.2f} s after asking for a new notebook")
    assert seconds < FIRST_OUTPUT_BOUND_S, (
        f"the output took {seconds:.1f} s\n--- gateway log ---\n{notebookos_gateway.log_text()[-4000:]}"
    )
