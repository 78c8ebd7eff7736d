"""Debian's Chromium driven by Selenium, as the browser tests use it: start it, wait for what a person would
see, log in through Airflow's own form. Never skipped: without Chromium and ChromeDriver (``make test``
installs them, scripts/install_browser.sh) a browser test fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 30

T = TypeVar("T")


@contextmanager
def chrome() -> Iterator[Any]:
    """A headless Chromium (1600x1200), quit afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    assert not missing, f"{', '.join(missing)} missing: run scripts/install_browser.sh (make test does)"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1200"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: Any, condition: Callable[[Any], T], what: str, timeout_s: float = WAIT_S) -> T:
    """``condition(driver)`` once it is truthy; elements the UI re-renders meanwhile are looked up again."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    waiter = WebDriverWait(driver, timeout_s, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))
    return waiter.until(condition, message=what)


def login(driver: Any, url: str, user: str, password: str) -> None:
    """Airflow's own login form, as a person fills it in."""
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{url}/auth/login")
    username = wait(driver, lambda d: d.find_element(By.NAME, "username"), "the login form")
    username.send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(driver, lambda d: any(c["name"] == "_token" for c in d.get_cookies()), f"{user}'s session cookie")


def button(scope: Any, text: str) -> Any:
    """The visible button of ``scope`` whose text is ``text`` (None if there is none yet)."""
    from selenium.webdriver.common.by import By

    found = [b for b in scope.find_elements(By.TAG_NAME, "button") if b.text.strip() == text and b.is_displayed()]
    return found[0] if found else None


def dialog(driver: Any, containing: str) -> Any:
    """The open dialog whose text contains ``containing`` (None if there is none yet)."""
    from selenium.webdriver.common.by import By

    found = [x for x in driver.find_elements(By.CSS_SELECTOR, "[role=dialog]") if containing in x.text]
    return found[0] if found else None
