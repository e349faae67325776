"""The built site as a person sees it: headless Chromium (Debian's ``chromium`` and ``chromium-driver``).

The site is served from a local HTTP server on 127.0.0.1. The home page, a guide, the options page
and a benchmark page must render their content and every image (loaded, with a width), with no
error in the browser's console; the search box must find ``preprocess``. Skips, saying why, only
where Chromium or its driver is missing (``.ci/run`` installs both with apt).
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading

import pytest

from site_build import built_site  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration  # tests/conftest.py: not in make test-fast's unit tier

PAGES = {  # path: text the page must show
    "": "synchronous parameter averaging",
    "guides/data/": "What fit accepts",
    "reference/options/": "num_workers",
    "benchmarks/suite/": "Elephas",
}


def _binary(*names):
    return next((path for name in names if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra has it)")
    chromium = _binary("chromium", "chromium-browser")
    driver_path = _binary("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("Chromium or chromedriver is missing: apt-get install chromium chromium-driver (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(built_site):
    site, _, _ = built_site
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def _console_errors(browser):
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.mark.parametrize("path", list(PAGES))
def test_page_renders_with_its_images_and_no_console_error(browser, server, path):
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(server + path)
    body = browser.find_element(By.CSS_SELECTOR, "article").text
    assert PAGES[path] in body, f"{path or 'the home page'} does not show {PAGES[path]!r}"
    images = browser.find_elements(By.CSS_SELECTOR, "article img")
    broken = [img.get_attribute("src") for img in images
              if not browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)]
    assert not broken, f"images that did not load on {path or 'the home page'}: {broken}"
    if path in ("", "benchmarks/suite/"):
        assert images, f"{path or 'the home page'} should show its images"
    errors = _console_errors(browser)
    assert not errors, f"console errors on {path or 'the home page'}: {errors}"


def test_search_finds_preprocess(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server)
    browser.find_element(By.CSS_SELECTOR, "label.md-search__icon, .md-search__input").click()
    box = WebDriverWait(browser, 20).until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
    box.send_keys("preprocess")
    results = WebDriverWait(browser, 30).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, ".md-search-result__item") or None)
    text = " ".join(r.text for r in results).lower()
    assert "preprocess" in text, text[:2000]
    assert not _console_errors(browser), _console_errors(browser)


def _search(browser, server, query):
    """The titles and links of the search results for ``query``, best first."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server)
    browser.find_element(By.CSS_SELECTOR, "label.md-search__icon, .md-search__input").click()
    box = WebDriverWait(browser, 20).until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
    box.send_keys(query)
    WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".md-search-result__item") or None)
    return [a.get_attribute("href")[len(server):]
            for a in browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item > a")]


def test_search_ranks_the_guides_above_the_tables(browser, server):
    """A search for "learning rate" ranked a benchmark page's table first (issue 60 item 20): the benchmark
    pages and the options table carry ``search: boost: 0.5``, so a guide comes first."""
    links = _search(browser, server, "learning rate")
    assert links and links[0].startswith("guides/"), links[:5]


def test_option_names_do_not_break_mid_word(browser, server):
    """Material lets inline code break anywhere; docs/stylesheets/extra.css keeps the options tables' names,
    flags and Params on one line, even in a narrow window."""
    browser.set_window_size(800, 900)
    try:
        browser.get(server + "reference/options/")
        cells, broken = browser.execute_script("""
            const codes = [...document.querySelectorAll('article .options-table td:not(:last-child) code')];
            return [codes.length, codes.filter(c => c.getClientRects().length > 1).map(c => c.textContent)];""")
    finally:
        browser.set_window_size(1280, 900)
    assert cells > 100, f"the options page has {cells} code cells in div.options-table"
    assert not broken, f"code cells broken over lines on the options page: {broken[:10]}"
