#!/usr/bin/env python3
"""Browser tests of invitations (issue 30: an invited person is told).

The owner invites a person by name from the CLI; on the web client's lists page the person sees the
invitation (title, owner, access) with Accept and Decline: Accept joins and the list shows; Decline takes it
away and the owner's roster says removed. Run through Scripts/browser-tests.sh.
"""
import os
import shutil
import sys
import tempfile

from selenium.webdriver.common.by import By

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import browser_tests as bt  # noqa: E402
from browser_tests import check, wait_for  # noqa: E402


def main():
    directory = tempfile.mkdtemp(prefix="lattice-invitations-")
    server = bt.Server(directory)
    driver = None
    results = []
    try:
        owner = bt.CLI(os.path.join(directory, "xena"))
        owner.run("signup", "xena", "--server", server.url)
        guest = bt.CLI(os.path.join(directory, "yuri"))
        guest.run("signup", "yuri", "--server", server.url)
        for title in ["Camping", "Taxes"]:
            owner.run("list", "create", title)
            owner.run("list", "add", title, "First item")
            owner.run("share", "create", title)
            owner.run("share", "invite", title, "yuri", "--permission", "read-write")
        driver = bt.browser()
        driver.get(guest.run("login", "--web"))
        bt.wait_ready(driver, "yuri")

        def invitations(d):
            return [li.text for li in d.find_elements(By.CSS_SELECTOR, "#invitation-list li")]

        def the_invited_person_sees_both_invitations():
            wait_for(driver, lambda d: len(invitations(d)) == 2, "two invitations on the lists page")
            texts = " ".join(invitations(driver))
            check("Camping" in texts and "Taxes" in texts and "xena" in texts and "can edit" in texts, texts)
            check(driver.find_element(By.ID, "invitations").is_displayed(), "the section shows")

        def accept_joins_the_list():
            row = next(li for li in driver.find_elements(By.CSS_SELECTOR, "#invitation-list li") if "Camping" in li.text)
            button = row.find_element(By.XPATH, ".//button[text()='Accept']")
            check("Accept" in button.get_attribute("aria-label") and "Camping" in button.get_attribute("aria-label"), "named")
            button.click()
            wait_for(driver, lambda d: "Joined" in d.find_element(By.ID, "notice").text, "the page says joined")
            bt.open_list(driver, "Camping")
            wait_for(driver, lambda d: [i[0] for i in bt.items_on_page(d)] == ["First item"], "the list's items")
            check(len(invitations(driver)) == 1, f"one invitation left: {invitations(driver)}")

        def decline_takes_it_away_and_the_owner_sees_it():
            row = next(li for li in driver.find_elements(By.CSS_SELECTOR, "#invitation-list li") if "Taxes" in li.text)
            row.find_element(By.XPATH, ".//button[text()='Decline']").click()
            wait_for(driver, lambda d: not invitations(d) and not d.find_element(By.ID, "invitations").is_displayed(),
                     "no invitation left, the section hides")
            roster = owner.run("share", "participants", "Taxes")
            check("yuri" in roster and "removed" in roster, f"the owner's roster: {roster}")

        results = bt.run_suite("invitations", [
            ("the invited person sees both invitations", the_invited_person_sees_both_invitations),
            ("Accept joins the list", accept_joins_the_list),
            ("Decline takes it away and the owner sees it", decline_takes_it_away_and_the_owner_sees_it)])
    finally:
        if driver:
            driver.quit()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{sum(results)} of {len(results)} invitation tests passed")
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
