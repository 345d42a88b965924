"""The status page of a real 2-host local pool in headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium): sign in through /login with the gateway's token, then the pool's hosts, the runs with their outcomes, and
a traced run's per-token timeline as SVG. Screenshots are kept under the test's tmp path (printed)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from swactor.localcluster import LocalCluster
from swactor.localcluster.run import follow
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc
from tests.e2e.conftest import needs_model
from tests.gateway.helpers import MODEL, gateway_pool, token_of

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
needs_chromium = pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                                    reason="needs Debian's chromium and chromium-driver (/usr/bin/chromium, "
                                           "/usr/bin/chromedriver): apt-get install chromium chromium-driver")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400), needs_model, needs_chromium]

PROMPT = "Once upon a time, in a small village,"


@pytest.fixture(scope="module")
def pool() -> Iterator[LocalCluster]:
    with gateway_pool() as c:
        yield c


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver, path: Path) -> None:
    """The whole page, however long (Chromium's DevTools capture beyond the window)."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 8000), "scale": 1}
    png = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                           "clip": clip})["data"]
    path.write_bytes(base64.b64decode(png))
    print(f"screenshot: {path}", flush=True)


def test_status_page_in_a_browser(pool: LocalCluster, browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    assert pool.openai_url is not None
    token = token_of(pool)
    base = pool.openai_url.removesuffix("/v1")
    answer = openai.OpenAI(base_url=pool.openai_url, api_key=token, max_retries=0, timeout=120).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert answer.choices[0].text
    with pool.channel() as ch:
        traced = follow(orchestrator_pb2_grpc.OrchestratorStub(ch),
                        opb.SubmitRunRequest(prompt=PROMPT, max_tokens=8, stages=2, trace_objects=True,
                                             ignore_eos=True, sampling=opb.Sampling(temperature=0)), timeout_s=300)
    assert traced.finished.outcome == opb.RUN_OUTCOME_COMPLETED, traced.finished

    browser.get(f"{base}/status")  # no cookie yet: the form
    assert browser.current_url.startswith(f"{base}/login?next=")
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.ID, "sign-in").click()
    # A click does not wait for the page it posts to: wait for that page (bounded, on a loaded machine).
    wait = WebDriverWait(browser, 30)
    assert "wrong token" in wait.until(EC.presence_of_element_located((By.ID, "error"))).text
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "sign-in").click()
    wait.until(EC.url_to_be(f"{base}/status"))

    hosts = browser.find_element(By.ID, "hosts").text
    for node_id in pool.node_ids:
        assert str(node_id) in hosts
    assert "available" in hosts
    assert "ready" in browser.find_element(By.ID, "pool").text
    recent = browser.find_element(By.ID, "recent")
    row = recent.find_element(By.XPATH, f".//tr[td/a[text()='{traced.run_id}']]").text
    assert "completed" in row and "max_tokens" in row
    assert browser.find_element(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]').get_attribute("content") == "5"
    shot(browser, tmp_path / "status.png")

    browser.get(f"{base}/status?run={traced.run_id}")
    assert browser.current_url == f"{base}/status/runs/{traced.run_id}"
    assert "This run was traced" in browser.find_element(By.ID, "timeline-note").text
    svg = browser.find_element(By.ID, "timeline")
    bars = svg.find_elements(By.TAG_NAME, "rect")
    # 8 tokens: 7 gaps, each the orchestrator, 3 hops, 2 dispatches and 2 computes
    assert len(bars) == 7 * 8, len(bars)
    assert svg.size["height"] > 50 and svg.size["width"] > 500
    assert "stage compute" in browser.find_element(By.ID, "means").text
    shot(browser, tmp_path / "traced_run.png")

    gateway_run = int(answer.id.rsplit("-", 1)[1])
    browser.get(f"{base}/status/runs/{gateway_run}")
    assert "This run was not traced" in browser.find_element(By.ID, "timeline-note").text
    gaps = answer.usage.completion_tokens - 1
    assert len(browser.find_element(By.ID, "timeline").find_elements(By.TAG_NAME, "rect")) == gaps
    shot(browser, tmp_path / "gateway_run.png")
