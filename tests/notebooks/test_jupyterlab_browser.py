"""The notebooks as a Studio user meets them: JupyterLab in a real browser (headless Chromium driven by
Playwright), notebook 01 (a training job, followed by the live widget) and notebook 07 (a training
session) run with "Run All Cells" in local mode with the CI parameters.

What is asserted is read from the page: the live widget renders and its step count rises while the job
runs; the plots appear; every code cell ran and none shows an error; the browser console logged no
error. Screenshots go to ``outputs/browser/`` (docs/LOCAL_MODE.md shows one of the live view mid-job,
``docs/jupyterlab_live_view.png``), with the steps the widget showed, in order.

Chromium is Debian's (``/usr/bin/chromium``, installed by the Makefile's ``environments`` target);
Playwright only drives it (no browser download). JupyterLab and its kernels run with nothing to reach:
no news feed, no update check, no extension manager.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest

from tools import run_notebooks

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
# This machine has no network: Chromium must not try to reach Google's services either.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "outputs" / "browser"
JOB_NOTEBOOK, SESSION_NOTEBOOK = "01_estimator_sft.ipynb", "07_training_session_sft.ipynb"
STEP_LABEL = re.compile(r"^(\d+)/(\d+)$")  # the live widget's "12/80"
LAB_CONFIG = """
c.ServerApp.ip = "127.0.0.1"
c.ServerApp.port = {port}
c.ServerApp.open_browser = False
c.ServerApp.allow_root = True  # CI's containers run as root
c.IdentityProvider.token = "{token}"
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
c.LabApp.extension_manager = "readonly"
"""
# A new user's settings, less the question whether to fetch Jupyter's news, and with every cell of a
# notebook in the page (JupyterLab otherwise leaves the cells out of view unrendered).
USER_SETTINGS = {
    "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "notebook-extension/tracker": {"windowingMode": "none"},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyterlab(root: Path, home: Path, env: dict):
    """JupyterLab serving ``root``, configured from ``home`` (nothing of this machine's user settings).
    The folder goes by the working directory, not the command line: the live view looks at its kernel's
    parent command line to tell a front end from papermill or pytest."""
    port, token = _free_port(), secrets.token_hex(16)
    (home / "config").mkdir(parents=True)
    (home / "config" / "jupyter_lab_config.py").write_text(LAB_CONFIG.format(port=port, token=token))
    for name, values in USER_SETTINGS.items():
        settings = home / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(values))
    env = {
        **env,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
    }
    log = (home / "jupyterlab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab"], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"JupyterLab did not start:\n{(home / 'jupyterlab.log').read_text()[-3000:]}"
                    ) from None
                time.sleep(0.5)
        yield url, token
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


class NotebookPage:
    """One notebook opened in JupyterLab, read as a person would: prompts, outputs, widgets."""

    def __init__(self, page, url: str, token: str, path: str):
        self.page = page
        page.goto(f"{url}/lab/tree/{path}?token={token}")
        self.panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        self.panel.locator(".jp-Notebook-cell").first.wait_for(timeout=120_000)
        self.wait_for_kernel()

    def wait_for_kernel(self, timeout_s: float = 120) -> None:
        """Until the status bar says the kernel is connected and idle ("Python 3 (ipykernel) | Idle"):
        cells run before that are silently dropped."""
        kernel_status = self.page.locator(".jp-StatusBar-TextItem[title^='Change kernel']")
        kernel_status.filter(has_text=re.compile(r"\| Idle$")).wait_for(timeout=timeout_s * 1000)

    def menu(self, menu: str, item: str) -> None:
        """Click ``item`` of the menu bar's ``menu``, by their labels, as a person would."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
        self.page.locator(
            ".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")
        ).click()

    def prompts(self) -> list[str]:
        """The input prompt of every code cell: "[3]:", "[*]:" (running or queued) or "[ ]:"."""
        return [text.strip() for text in self.panel.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()]

    def running(self) -> bool:
        return any("*" in prompt for prompt in self.prompts())

    def widget_steps(self) -> list[tuple[int, int]]:
        texts = self.panel.locator(".jupyter-widgets.widget-label").all_text_contents()
        return [tuple(map(int, m.groups())) for m in (STEP_LABEL.match(t.strip()) for t in texts) if m]

    def tracebacks(self) -> list[str]:
        """Error outputs: JupyterLab renders them as stderr with the traceback (streamed stderr, such as
        warnings, has none)."""
        texts = self.panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        return [t for t in texts.all_text_contents() if "Traceback" in t or re.search(r"^\w+(Error|Exception)\b", t)]

    def images(self) -> int:
        return self.panel.locator(".jp-OutputArea-output img").count()

    def screenshot_first_figure(self, path: Path) -> None:
        self.panel.locator(".jp-Cell", has=self.page.locator(".jp-OutputArea-output img")).first.screenshot(
            path=str(path)
        )


@contextmanager
def chromium(profile: Path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),  # a fresh --user-data-dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Notebook 00 run with papermill (the data and model the others read), then JupyterLab over a copy
    of the repository whose notebooks 01 and 07 carry the CI parameters, as papermill injects them."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make environments` installs it (apt-get install chromium)")
    out = tmp_path_factory.mktemp("browser")
    work_dir = out / "work"
    saved = dict(os.environ)
    try:
        kernel_env = run_notebooks.prepare_environment(out)
        os.environ.setdefault("OMP_NUM_THREADS", "2")
        (out / "notebooks").mkdir()
        setup = run_notebooks.execute(
            run_notebooks.NOTEBOOK_DIR / "00_setup_and_data.ipynb", out, work_dir, "tiny", 600
        )
        assert setup["status"] == "ok", setup.get("error")
        root = out / "repository"
        (root / "notebooks").mkdir(parents=True)
        for name in ("scripts",):  # the source_dir the notebooks upload (../scripts); the rest is imported by name
            (root / name).symlink_to(REPO / name, target_is_directory=True)
        for name in (JOB_NOTEBOOK, SESSION_NOTEBOOK):
            path = run_notebooks.NOTEBOOK_DIR / name
            nb = parameterize_notebook(load_notebook_node(str(path)), run_notebooks.ci_parameters(path, work_dir))
            nbformat.write(nb, str(root / "notebooks" / name))
        env = {**os.environ, **kernel_env, "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]}
        env.pop("NOTEBOOK_PLAIN_OUTPUT")  # a browser draws the widgets
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        with jupyterlab(root, out / "jupyter", env) as (url, token), chromium(out / "chromium-profile") as browser:
            yield browser, url, token, root
    finally:
        from local_mode import session_service

        session_service.stop_service(out / "sagemaker-local")  # notebook 07's endpoint outlives its kernel
        os.environ.clear()
        os.environ.update(saved)


def run_all(lab, name: str, timeout_s: float, while_running=None) -> tuple[NotebookPage, list[str]]:
    """Open ``name``, Run All Cells, call ``while_running(page)`` about twice a second until every cell
    ran, and save the notebook. Returns the page and the browser console's errors."""
    browser, url, token, root = lab
    page = browser.new_page()
    console_errors = []
    page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: console_errors.append(str(error)))
    notebook = NotebookPage(page, url, token, f"notebooks/{name}")
    notebook.menu("Run", "Run All Cells")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputPrompt')]"
        ".some(p => p.textContent.includes('*'))",
        timeout=30_000,
    )
    deadline = time.monotonic() + timeout_s
    while notebook.running() or notebook.panel.locator(".jp-Notebook-ExecutionIndicator").get_attribute(
        "data-status"
    ) not in ("idle", None):
        assert time.monotonic() < deadline, f"{name} still running after {timeout_s:.0f} s: {notebook.prompts()}"
        if while_running:
            while_running(notebook)
        time.sleep(0.5)
    notebook.menu("File", "Save Notebook")
    page.screenshot(path=str(SCREENSHOTS / f"{name[:2]}_after_run_all.png"), full_page=False)
    return notebook, console_errors


def assert_ran_cleanly(notebook: NotebookPage, saved: Path, console_errors: list[str]) -> None:
    prompts = notebook.prompts()
    assert prompts and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), f"cells that did not run: {prompts}"
    assert notebook.tracebacks() == []
    assert console_errors == []
    # the saved file agrees with the page
    outputs = [o for c in nbformat.read(str(saved), as_version=4).cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]


@pytest.mark.timeout(900)
def test_notebook_01_runs_in_jupyterlab_with_the_live_widget(lab):
    max_steps = run_notebooks.CI_PARAMETERS["01"]["max_steps"]
    seen: list[tuple[float, int]] = []  # (time, step) whenever the widget shows a new step

    def follow_the_widget(notebook: NotebookPage) -> None:
        for step, total in notebook.widget_steps():
            assert total == max_steps
            if not seen or step != seen[-1][1]:
                seen.append((time.monotonic(), step))
                if 0.3 * max_steps <= step <= 0.7 * max_steps and not (SCREENSHOTS / "01_live_view.png").exists():
                    widget = notebook.panel.locator(".jp-Cell", has=notebook.page.locator(".widget-hprogress"))
                    widget.screenshot(path=str(SCREENSHOTS / "01_live_view.png"))

    notebook, console_errors = run_all(lab, JOB_NOTEBOOK, 600, follow_the_widget)
    steps = [step for _, step in seen]
    # the count rose while the job ran: several values seen one after another, ending at the last step
    assert len(steps) >= 3 and steps == sorted(steps) and steps[0] < max_steps, steps
    assert steps[-1] == max_steps, steps
    assert notebook.panel.locator(".widget-hprogress").count() == 1  # the progress bar rendered
    assert (SCREENSHOTS / "01_live_view.png").exists()
    assert notebook.images() >= 1  # plot_metrics' figure
    notebook.screenshot_first_figure(SCREENSHOTS / "01_plot.png")
    (SCREENSHOTS / "01_widget_steps.json").write_text(json.dumps(steps))
    assert_ran_cleanly(notebook, lab[3] / "notebooks" / JOB_NOTEBOOK, console_errors)


@pytest.mark.timeout(600)
def test_notebook_07_runs_in_jupyterlab_in_the_sdk_v3_kernel(lab):
    notebook, console_errors = run_all(lab, SESSION_NOTEBOOK, 420)
    kernel = notebook.panel.locator(".jp-KernelName").inner_text()
    assert kernel == "SageMaker SDK v3", kernel
    assert notebook.images() >= 1  # the loss curve
    notebook.screenshot_first_figure(SCREENSHOTS / "07_plot.png")
    assert_ran_cleanly(notebook, lab[3] / "notebooks" / SESSION_NOTEBOOK, console_errors)
