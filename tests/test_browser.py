"""A person's view: Debian's Chromium, headless, fills in the web form and opens the API docs.

The app runs under waitress on a free loopback port; screenshots land in the test's tmp_path.
.ci/run installs chromium and chromium-driver when they are missing; elsewhere the test is
skipped without them (and fails on CI, where they must be there).
"""

from pathlib import Path

import pytest

from leadsvc.models import Lead, Workspace
from conftest import ON_CI, new_phone, with_form

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# Flags that work headless as root in a container, with nothing fetched from the network.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,1600")
WAIT = 60   # seconds: a generous deadline, never a timing assertion

pytestmark = pytest.mark.slow


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        message = f"{CHROMIUM} or {CHROMEDRIVER} is missing (apt-get install chromium chromium-driver)"
        if ON_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    # Both paths given, so Selenium never looks for (or downloads) a browser or driver itself.
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


def test_a_person_submits_the_web_form_and_reads_the_docs(browser, live_server, make_workspace, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import Select, WebDriverWait

    tenant = make_workspace(with_form)
    form_id = tenant.ids.forms["Website enquiry"]
    phone = new_phone()

    browser.get(f"{live_server}/forms/{form_id}")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Website enquiry"
    browser.find_element(By.ID, "field-first_name").send_keys("Meera")
    browser.find_element(By.ID, "field-last_name").send_keys("Nair")
    browser.find_element(By.ID, "field-phone").send_keys(phone[3:])           # as people type it: 98...
    browser.find_element(By.ID, "field-email").send_keys("meera@example.com")
    Select(browser.find_element(By.ID, "field-custom_fields-product_interest")).select_by_value("villa")
    browser.find_element(By.ID, "field-custom_fields-budget_confirmed").click()
    assert not browser.find_element(By.ID, "field-website").is_displayed(), "the honeypot is out of sight"
    browser.save_screenshot(str(tmp_path / "form.png"))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(browser, WAIT).until(ready.text_to_be_present_in_element((By.TAG_NAME, "h1"), "Thank you"))
    browser.save_screenshot(str(tmp_path / "thanks.png"))

    lead = (Lead.select().join(Workspace).where((Workspace.public_id == tenant.public_id) & (Lead.phone == phone))
            .get())
    assert (lead.first_name, lead.email) == ("Meera", "meera@example.com")
    assert lead.source.public_id == tenant.ids.sources["Website"]
    assert lead.owner.public_id == tenant.ids.members["s1@t.test"], "routed by the villa rule"
    assert lead.custom_fields == {"product_interest": "villa", "budget_confirmed": True}

    browser.get(f"{live_server}/docs")
    WebDriverWait(browser, WAIT).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".opblock")) > 10)
    paths = {element.get_attribute("data-path")
             for element in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert {"/api/v1/leads", "/api/v1/leads/{public_id}/notes", "/api/v1/reports/funnel",
            "/api/v1/forms/{form_id}/submissions"} <= paths
    browser.save_screenshot(str(tmp_path / "docs.png"))
    for name in ("form.png", "thanks.png", "docs.png"):
        assert (tmp_path / name).stat().st_size > 1000
