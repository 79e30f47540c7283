"""The chat page at / in headless Chromium (Debian's chromium and chromium-driver, driven by
selenium): type a message, send it, see the reply stream in. The reply in the page must equal the
one the openai client gets for the same conversation (the server runs greedy), and the screenshot
of the reply's bubble must show text (dark pixels on its light background).

    python3 test_browser.py SLUICE_BINARY SOURCE_DIR
"""

import io
import os
import shutil
import sys
import tempfile
import time
import unittest

import serve_util as su

QUESTION = "What is the capital of France? Answer in one sentence."


def chromium_paths():
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None)
    return browser, driver


class Browser(unittest.TestCase):
    def test_chat_page_streams_the_reply(self):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        browser, driver_path = chromium_paths()
        s = su.Server("--temp", "0")
        driver = None
        try:
            want = su.openai_client(s).chat.completions.create(
                model="x", messages=[{"role": "user", "content": QUESTION}]).choices[0].message.content
            self.assertTrue(want.strip())
            opts = webdriver.ChromeOptions()
            opts.binary_location = browser
            for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                      "--window-size=1000,700", f"--user-data-dir={tempfile.mkdtemp(prefix='serve-chromium-')}"]:
                opts.add_argument(a)
            driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
            driver.set_page_load_timeout(60)
            driver.get(s.url + "/")
            self.assertEqual(driver.title, "sluice chat")
            box = driver.find_element(By.ID, "input")
            box.send_keys(QUESTION)
            driver.find_element(By.ID, "send").click()
            reply = WebDriverWait(driver, 300).until(
                lambda d: d.find_element(By.CSS_SELECTOR, ".msg.assistant[data-done='1'], .msg.error[data-done='1']"))
            self.assertEqual(reply.get_attribute("class"), "msg assistant", reply.text)
            self.assertEqual(reply.text.strip(), want.strip())
            user = driver.find_element(By.CSS_SELECTOR, ".msg.user")
            self.assertEqual(user.text, QUESTION)
            # The screenshot shows the reply: its bubble has text-coloured pixels.
            shot = os.path.join(tempfile.gettempdir(), "serve-browser-test.png")
            driver.save_screenshot(shot)
            from PIL import Image
            img = Image.open(io.BytesIO(reply.screenshot_as_png)).convert("L")
            dark = sum(img.histogram()[:100])
            self.assertGreater(dark, 50, f"the reply's bubble looks empty (screenshot: {shot})")
            print(f"reply: {reply.text!r}; screenshot: {shot}", file=sys.stderr)
        finally:
            if driver:
                driver.quit()
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    b, d = chromium_paths()
    if not (b and d):
        su.require(False, "chromium and chromium-driver are not installed (scripts/setup.sh installs them)")
    sys.exit(su.main(need_selenium=True))
