"""The browser infrastructure itself: chromium opens the real server's UI at 1,600 px."""


def test_prefect_ui_opens_in_chromium(page, ui_url, screenshot):
    page.goto(f"{ui_url}/runs")
    page.get_by_text("Runs", exact=True).first.wait_for()
    assert page.evaluate("window.innerWidth") == 1600
    assert screenshot(page, "runs").stat().st_size > 10_000
