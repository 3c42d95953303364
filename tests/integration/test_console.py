"""The web console in a real browser: Debian's headless Chromium, driven by Selenium, against a
real local cluster; jobs go in through the real commands and the pages must follow them live.

Screenshots are kept as test artefacts (the path is printed: pytest -s, or -rA's output).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, wait_until

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                       reason="needs Debian's chromium and chromium-driver (.ci/run installs them)"),
]
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402

# Without the networking flags Chromium reaches for Google's services and, on a closed network,
# its own connections are refused; a fresh profile keeps one test's cookies from the next's.
TRAIN = """#!/bin/bash
#SBATCH -J train-big
#SBATCH -N 2
#SBATCH --gres=gpu:4
for i in $(seq 1 600); do echo "step $i loss 0.$((1000 - i))"; sleep 0.5; done
"""

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("console"), nodes=3, gpus_per_node=4).up()
    yield c
    c.down()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = Path(os.environ.get("SHOAL_CONSOLE_SHOTS") or tmp_path_factory.mktemp("console-screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    print(f"\nconsole screenshots: {d}")
    return d


def open_browser(width: int = 1360, height: int = 900):
    profile = tempfile.mkdtemp(prefix="shoal-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}", f"--window-size={width},{height}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    driver.profile_dir = profile
    return driver


@pytest.fixture
def browser():
    driver = open_browser()
    yield driver
    driver.quit()
    shutil.rmtree(driver.profile_dir, ignore_errors=True)


def log_in(driver, cluster: LocalCluster, token: str, page: str = "overview") -> None:
    driver.get(f"{cluster.server}/console/{page}")
    assert "/console/login" in driver.current_url  # not logged in: the login page first
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "login").click()
    wait_until(lambda: driver.current_url.endswith(f"/console/{page}"), 10, f"the {page} page after logging in")
    wait_until(lambda: rendered(driver) >= 1, 10, "the page's first render")


def rendered(driver) -> int:
    return int(driver.execute_script("return document.body.dataset.rendered || 0"))


def text(driver, css: str) -> str:
    """The element's text now (read in one step: the page re-renders under Selenium's feet)."""
    return driver.execute_script("return document.querySelector(arguments[0])?.innerText || ''", css)


def click(driver, css: str) -> None:
    wait_until(lambda: driver.execute_script(
        "const e = document.querySelector(arguments[0]); if (e) e.click(); return !!e", css), 10, css)


def count(driver, css: str) -> int:
    return driver.execute_script("return document.querySelectorAll(arguments[0]).length", css)


def mark_page(driver) -> None:
    """Leave a mark a reload would wipe: later checks prove the page changed in place."""
    driver.execute_script("window.__noReload = true")


def not_reloaded(driver) -> bool:
    return driver.execute_script("return window.__noReload === true")


def test_a_user_logs_in_and_watches_jobs_come_and_go_without_reloading(cluster, browser, shots):
    driver = browser
    assert f"console  {cluster.server}/console" in cluster.up_output  # shoal up says where
    driver.get(f"{cluster.server}/console/queue")
    driver.find_element(By.ID, "token").send_keys("shoal_not-a-real-token")
    driver.find_element(By.ID, "login").click()
    wait_until(lambda: "invalid token" in text(driver, "#error"), 10, "the login page's refusal")
    cookies = {c["name"]: c for c in driver.get_cookies()}
    assert "shoal_console" not in cookies

    log_in(driver, cluster, cluster.admin_token, "queue")
    cookie = {c["name"]: c for c in driver.get_cookies()}["shoal_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert driver.execute_script("return document.cookie") == ""  # the script cannot read the token
    assert "No jobs match" in text(driver, "main")
    driver.save_screenshot(str(shots / "queue-empty.png"))
    mark_page(driver)

    # Two nodes' worth of GPUs held, then a job that must wait for them.
    big = cluster.sbatch(script=TRAIN)
    waiting = cluster.sbatch("-J", "waits", "-N", "2", "--gres=gpu:4", "--wrap", "sleep 300")
    row = f'tr[data-job="{waiting}"]'
    wait_until(lambda: text(driver, f'tr[data-job="{big}"]') and "RUNNING" in text(driver, f'tr[data-job="{big}"]'),
               20, "the running job on the queue page")
    wait_until(lambda: "Resources" in text(driver, row), 20, "the waiting job's reason (Resources)")
    assert not_reloaded(driver)
    driver.save_screenshot(str(shots / "queue.png"))

    # The filter narrows the table without a reload.
    Select(driver.find_element(By.CSS_SELECTOR, "select[name=state]")).select_by_value("PENDING")
    wait_until(lambda: not count(driver, f'tr[data-job="{big}"]'), 10, "the filter")
    assert "state=PENDING" in driver.current_url and not_reloaded(driver)

    # The job page: script for its owner, the GPUs it holds, and its cancel button.
    driver.get(f"{cluster.server}/console/jobs/{big}")
    wait_until(lambda: rendered(driver) >= 1, 10, "the job page")
    mark_page(driver)
    assert "loss" in text(driver, "#script")
    assert "#SBATCH --gres=gpu:4" in text(driver, ".directives")
    assert "train-big" in text(driver, "h2")
    assert "0,1,2,3" in text(driver, "main")
    # The output's tail follows the running job.
    wait_until(lambda: "step 2 " in text(driver, "#output"), 20, "the job's output on its page")
    seen = max(int(n) for n in re.findall(r"step (\d+) ", text(driver, "#output")))
    wait_until(lambda: f"step {seen + 3} " in text(driver, "#output"), 20, "later output, without a reload")
    assert not_reloaded(driver)
    # Its GPU use, plotted per node from the agents' samples as they come (two nodes, two lines).
    wait_until(lambda: count(driver, "#gpu-plots figure:first-of-type polyline") == 2, 40,
               "the job's GPU utilisation plot, a line per node")
    assert "GPUs sampled8" in text(driver, "#gpu-summary").replace("\n", "").replace("\t", "")
    assert not_reloaded(driver)
    driver.save_screenshot(str(shots / "job.png"))
    click(driver, "#job-cancel")
    wait_until(lambda: "CANCELLED" in text(driver, "h2") or "COMPLETING" in text(driver, "h2"), 15,
               "the cancelled job's state on its page")
    assert not_reloaded(driver)
    assert cluster.job(big)["state"] == "CANCELLED"
    # ... and the waiting job starts in its place, seen on the queue page.
    driver.get(f"{cluster.server}/console/queue")
    wait_until(lambda: "RUNNING" in text(driver, f'tr[data-job="{waiting}"]'), 30, "the waiting job starting")
    cluster.run(["scancel", str(waiting)])


def test_the_gpu_grid_agrees_with_sinfo_and_squeue(cluster, browser, shots):
    driver = browser
    log_in(driver, cluster, cluster.admin_token)
    mark_page(driver)
    node0, node1, node2 = cluster.node_names()
    job = cluster.sbatch("-J", "two-gpus", "-w", node0, "--gres=gpu:2", "--wrap", "sleep 300")
    cluster.run(["scontrol", "update", f"NodeName={node2}", "State=DRAIN", "Reason=bad fan"])

    def cells(node: str, holder: str) -> int:
        return count(driver, f'.node[data-node="{node}"] .gpu[data-holder="{holder}"]')

    wait_until(lambda: cells(node0, "training") == 2 and cells(node2, "drained") == 4, 20,
               "the grid to show the job's GPUs and the drained node")
    assert not_reloaded(driver)
    # Against sinfo: each node's GPU count (its GRES) and state word.
    sinfo = cluster.run(["sinfo", "-N", "-h", "-o", "%N %G %t"]).stdout.split("\n")
    for line in filter(None, sinfo):
        name, gres, state = line.split()
        total = int(re.search(r":(\d+)$", gres).group(1))
        assert count(driver, f'.node[data-node="{name}"] .gpu') == total
        assert text(driver, f'.node[data-node="{name}"] .state') == state, line
    assert "bad fan" in text(driver, f'.node[data-node="{node2}"] .reason')
    # ...and the held GPUs against squeue's: the job's GPUs, on its node.
    held = cluster.run(["squeue", "-h", "-j", str(job), "-o", "%N %b"]).stdout.split()
    assert held[0] == node0 and held[1].endswith(":2")
    assert cells(node0, "idle") == 2 and cells(node1, "idle") == 4
    totals = text(driver, "table.totals tbody tr").split("\t")
    # partition, nodes, GPUs, then training serving completing idle drained down
    assert totals[:9] == ["gpu-a100", "3", "12", "2", "", "", "6", "4", ""], totals
    driver.save_screenshot(str(shots / "overview.png"))

    for page in ("nodes", "accounting", "serving"):
        driver.get(f"{cluster.server}/console/{page}")
        wait_until(lambda: rendered(driver) >= 1, 10, f"the {page} page")
        driver.save_screenshot(str(shots / f"{page}.png"))
        if page == "accounting":  # GPU-hours over time: bars for the jobs that have run
            assert count(driver, "#usage-charts svg rect") >= 1, text(driver, "main")
            assert "GPU-hours by account, per minute" in text(driver, "#usage-charts")
    # No page broke its own rules (Content-Security-Policy) or failed a request on the way.
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    driver.get(f"{cluster.server}/console/nodes")
    wait_until(lambda: rendered(driver) >= 1, 10, "the nodes page")
    assert "bad fan" in text(driver, f'tr[data-node="{node2}"]')
    click(driver, f'button[data-node-action="resume"][data-name="{node2}"]')
    wait_until(lambda: "idle" in text(driver, f'tr[data-node="{node2}"] .state'), 15, "the resumed node")
    driver.execute_script("document.querySelector(arguments[0]).value = 'cabling'", f'input[data-reason="{node1}"]')
    click(driver, f'button[data-node-action="drain"][data-name="{node1}"]')
    wait_until(lambda: "cabling" in text(driver, f'tr[data-node="{node1}"]'), 15, "the drain's reason")
    assert "cabling" in cluster.run(["sinfo", "-R", "-h"]).stdout
    cluster.run(["scontrol", "update", f"NodeName={node1}", "State=RESUME"])

    # A narrow window (a phone): the page still fits and the grid wraps.
    driver.set_window_size(420, 900)
    driver.get(f"{cluster.server}/console/overview")
    wait_until(lambda: rendered(driver) >= 1, 10, "the overview page")
    assert driver.execute_script("return document.documentElement.scrollWidth") <= 440
    driver.save_screenshot(str(shots / "overview-narrow.png"))
    cluster.run(["scancel", str(job)])


def test_a_read_only_user_sees_but_cannot_cancel(cluster, browser, shots):
    driver = browser
    rita = cluster.api("POST", "/shoal/v1/tokens", {"user": "rita", "role": "read-only"})["token"]
    job = cluster.sbatch("-J", "not-ritas", "--wrap", "sleep 300")
    cluster.wait_for(job, states=("RUNNING",), timeout=20)
    log_in(driver, cluster, rita, "queue")
    wait_until(lambda: "RUNNING" in text(driver, f'tr[data-job="{job}"]'), 10, "the job on rita's queue page")
    driver.get(f"{cluster.server}/console/jobs/{job}")
    wait_until(lambda: rendered(driver) >= 1, 10, "the job page")
    assert not count(driver, "button[data-action]")
    assert "Shown only to the job's owner" in text(driver, "main")  # no script for her
    assert not count(driver, "#output, #script")
    # Not merely hidden: the API the page uses refuses her, with the server's own message.
    answer = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/shoal/v1/jobs/%d/cancel', {method: 'POST', body: '{}', credentials: 'same-origin',
               headers: {'X-Shoal-Console': '1', 'Content-Type': 'application/json'}})
          .then(async r => done([r.status, (await r.json()).detail]));""" % job)
    assert answer[0] == 403 and "read-only" in answer[1], answer
    # The cookie alone, without the console's header (as a cross-site form would send it), is no credential.
    plain = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/shoal/v1/whoami', {credentials: 'same-origin'}).then(r => done(r.status));""")
    assert plain == 401
    driver.save_screenshot(str(shots / "job-read-only.png"))
    assert cluster.job(job)["state"] == "RUNNING"
    cluster.run(["scancel", str(job)])
