#!/usr/bin/env python3
"""Browser tests of the devices page (issue 30: add a new device from a signed-in one).

A person signed in on the web approves a new device's code on /web/devices.html: the CLI on the new device,
started with `lattice login --server URL`, is signed in to their account. A denied code signs nothing in, a
wrong code is refused with the server's reason, and a device can be signed out from the page. Run through
Scripts/browser-tests.sh (the same environment as browser_tests.py, whose helpers it uses).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from selenium.webdriver.common.by import By

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import browser_tests as bt  # noqa: E402
from browser_tests import check, wait_for  # noqa: E402


class DeviceLogin:
    """`lattice login --server URL --name NAME` running in the background; its output read as it comes."""

    def __init__(self, home, server, name):
        self.lines = []
        self.process = subprocess.Popen([bt.LATTICE, "login", "--server", server, "--name", name],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=dict(os.environ, LATTICE_HOME=home))
        threading.Thread(target=lambda: [self.lines.append(line) for line in self.process.stdout], daemon=True).start()

    def code(self):
        deadline = time.monotonic() + bt.WAIT
        while time.monotonic() < deadline:
            for line in self.lines:
                found = re.search(r"lattice devices approve ([A-Z]{4}-[A-Z]{4})", line)
                if found:
                    return found.group(1)
            time.sleep(0.1)
        raise bt.Failure(f"no code from lattice login: {''.join(self.lines)}")

    def finish(self, timeout=30):
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()


def main():
    directory = tempfile.mkdtemp(prefix="lattice-devices-")
    server = bt.Server(directory)
    results = []
    driver = None
    try:
        owner = bt.CLI(os.path.join(directory, "ivy"))
        owner.run("signup", "ivy", "--server", server.url)
        driver = bt.browser()
        driver.get(owner.run("login", "--web"))
        bt.wait_ready(driver, "ivy")

        def open_page():
            driver.get(server.url + "/web/devices.html")
            wait_for(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "true", "the devices page")

        def approve_a_code():
            home = os.path.join(directory, "laptop")
            login = DeviceLogin(home, server.url, "laptop")
            code = login.code()
            check(any("/web/devices.html" in line for line in login.lines), f"the CLI names the page: {login.lines}")
            open_page()
            bt.type_into(driver, "user-code", code.lower().replace("-", " "))  # case and separators do not matter
            bt.type_into(driver, "device-name", "Ivy's laptop")
            driver.find_element(By.ID, "approve").click()
            wait_for(driver, lambda d: "Approved Ivy's laptop" in d.find_element(By.ID, "status").text, "the page says approved")
            check(login.finish() == 0, f"lattice login finished: {''.join(login.lines)}")
            whoami = subprocess.run([bt.LATTICE, "whoami"], capture_output=True, text=True, timeout=30,
                                    env=dict(os.environ, LATTICE_HOME=home)).stdout
            check("ivy" in whoami, f"the new device is ivy's: {whoami}")
            wait_for(driver, lambda d: "Device: Ivy's laptop" in d.find_element(By.ID, "tokens").text,
                     "the device is listed")
            bt.shoot_both(driver, "devices")
            check(driver.find_element(By.ID, "user-code").get_attribute("value") == "", "the code field is cleared")

        def deny_a_code():
            login = DeviceLogin(os.path.join(directory, "stranger"), server.url, "stranger")
            code = login.code()
            open_page()
            bt.type_into(driver, "user-code", code)
            driver.find_element(By.ID, "deny").click()
            wait_for(driver, lambda d: "Denied" in d.find_element(By.ID, "status").text, "the page says denied")
            check(login.finish() != 0, "lattice login fails after a denial")
            check("stranger" not in driver.find_element(By.ID, "tokens").text, "nothing was signed in")

        def a_wrong_code_is_refused_with_the_reason():
            open_page()
            bt.type_into(driver, "user-code", "BCDF-GHJK")
            driver.find_element(By.ID, "approve").click()
            wait_for(driver, lambda d: "no device is waiting for the code" in d.find_element(By.ID, "status").text,
                     "the server's reason is shown")
            check("error" in driver.find_element(By.ID, "status").get_attribute("class"), "shown as an error")

        def sign_a_device_out():
            open_page()
            row = wait_for(driver, lambda d: [r for r in d.find_elements(By.CSS_SELECTOR, "#tokens li")
                                              if "Ivy's laptop" in r.text], "the laptop's row")[0]
            button = row.find_element(By.CSS_SELECTOR, "button")
            check("Ivy's laptop" in button.get_attribute("aria-label"), "the button names the device")
            button.click()
            check("sure" in button.text, "a second press confirms")
            button.click()
            wait_for(driver, lambda d: "Ivy's laptop" not in d.find_element(By.ID, "tokens").text, "the laptop is gone")
            done = subprocess.run([bt.LATTICE, "sync"], capture_output=True, text=True, timeout=30,
                                  env=dict(os.environ, LATTICE_HOME=os.path.join(directory, "laptop")))
            check(done.returncode != 0, f"the signed-out laptop is refused: {done.stdout} {done.stderr}")
            check("(this browser)" in driver.find_element(By.ID, "tokens").text, "this browser is marked, without a button")

        def signed_out_the_page_says_so():
            bt.signed_out(driver)
            driver.get(server.url + "/web/devices.html")
            wait_for(driver, lambda d: d.find_element(By.ID, "signed-out").is_displayed(), "the signed-out note")
            check(not driver.find_element(By.ID, "add-section").is_displayed(), "no approval form signed out")

        results = bt.run_suite("devices", [("approve a code", approve_a_code), ("deny a code", deny_a_code),
                           ("a wrong code is refused with the reason", a_wrong_code_is_refused_with_the_reason),
                           ("sign a device out", sign_a_device_out),
                           ("signed out, the page says so", signed_out_the_page_says_so)])
    finally:
        if driver:
            driver.quit()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{sum(results)} of {len(results)} devices page tests passed")
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
