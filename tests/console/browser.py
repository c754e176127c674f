#!/usr/bin/env python3
"""Drives the broker's web console in headless Chromium (through chromedriver's WebDriver API)
and checks what each page shows against what the test that started the broker expects.

Usage: browser.py EXPECTED.json [--screenshots DIR]

EXPECTED.json (written by tests/console.rs) holds the console's URL, the auth token, and what
each page must show. Exits 0 when every check passes; otherwise prints what differed and exits
1. Standard library only; needs `chromium` and `chromedriver` (Debian: chromium,
chromium-driver) on PATH.
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

WAIT_SECONDS = 20


class WebDriver:
    """The few WebDriver calls the checks need, over HTTP to a chromedriver of our own."""

    def __init__(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.driver = subprocess.Popen(
            [shutil.which("chromedriver"), f"--port={port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            try:
                self._call("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        chrome = {
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--no-first-run", "--disable-extensions"],
        }
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary:
            chrome["binary"] = binary
        session = self._call("POST", "/session", {
            "capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": chrome}}
        })
        self.session = f"/session/{session['sessionId']}"

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read() or b"{}").get("value")
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"WebDriver {method} {path}: {error.read().decode(errors='replace')}")

    def go(self, url):
        self._call("POST", self.session + "/url", {"url": url})

    def run(self, script, *args):
        return self._call("POST", self.session + "/execute/sync", {"script": script, "args": list(args)})

    def screenshot(self, path):
        with open(path, "wb") as out:
            out.write(base64.b64decode(self._call("GET", self.session + "/screenshot")))

    def close(self):
        try:
            self._call("DELETE", self.session)
        finally:
            self.driver.terminate()
            self.driver.wait(timeout=10)


# Each table's rows as lists of their cells' text.
ROWS = "return [...document.querySelectorAll(arguments[0] + ' tbody tr')].map(r => [...r.cells].map(c => c.textContent.trim()));"
TEXT = "const e = document.querySelector(arguments[0]); return e && !e.closest('[hidden]') ? e.textContent.trim() : null;"


def wait_for(browser, what, probe):
    """Polls `probe` until it returns something truthy; fails after WAIT_SECONDS."""
    deadline = time.monotonic() + WAIT_SECONDS
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    status = browser.run(TEXT, "#status")
    raise AssertionError(f"waited {WAIT_SECONDS} s for {what}; last saw {last!r}; status line: {status!r}")


def wait_rows(browser, selector, expected, columns, what):
    """Waits until table `selector`'s rows, cut to `columns`, are `expected`."""
    def probe():
        rows = browser.run(ROWS, selector)
        return [[row[c] for c in columns] for row in rows] == expected
    try:
        wait_for(browser, what, probe)
    except AssertionError:
        rows = [[row[c] for c in columns] for row in browser.run(ROWS, selector)]
        raise AssertionError(f"{what}: expected {expected}, the page shows {rows}")


def number(n):
    return f"{n:,}"


def check(expected, screenshots):
    url = expected["url"]
    browser = WebDriver()
    try:
        # Signing in: a wrong token is refused, the right one opens the topics.
        browser.go(url)
        wait_for(browser, "the sign-in form", lambda: browser.run(TEXT, "#sign-in h1") == "Sign in")
        if screenshots:
            browser.screenshot(os.path.join(screenshots, "console-sign-in.png"))
        sign_in = ("document.getElementById('token').value = arguments[0];"
                   "document.querySelector('#sign-in button').click();")
        browser.run(sign_in, "not the token")
        wait_for(browser, "the wrong token's refusal",
                 lambda: browser.run(TEXT, "#sign-in-error") == "That is not the broker's auth token.")
        browser.run(sign_in, expected["token"])

        # Topics: the first page, in name order, with their figures; the pager; the search.
        topics = expected["topics"]
        wait_rows(browser, "#topics", [[t["name"], number(t["partitions"]), number(t["records"])]
                                       for t in topics["first_page"]], [0, 1, 2], "the first page of topics")
        wait_for(browser, "the pager", lambda: browser.run(TEXT, "#page-of") == topics["page_of"])
        wait_for(browser, "the summary", lambda: (browser.run(TEXT, "#summary") or "").startswith(topics["summary"]))
        if screenshots:
            browser.screenshot(os.path.join(screenshots, "console-topics.png"))
        browser.run("document.getElementById('next').click();")
        wait_rows(browser, "#topics", [[name] for name in topics["second_page"]], [0], "the second page of topics")
        browser.run("const s = document.getElementById('search'); s.value = arguments[0];"
                    "s.dispatchEvent(new Event('input'));", topics["search"])
        wait_rows(browser, "#topics", [[name] for name in topics["found"]], [0], f"the topics matching {topics['search']!r}")

        # One topic: its partitions, its groups, its latest records as text and as hex.
        topic = expected["topic"]
        browser.go(f"{url}#/topic/{topic['name']}")
        wait_rows(browser, "#partitions", [[number(c) for c in p] for p in topic["partitions"]], [0, 1, 2, 3],
                  f"the partitions of {topic['name']}")
        wait_for(browser, "the topic's settings",
                 lambda: (browser.run(TEXT, "#topic-settings") or "").startswith(topic["settings"]))
        for group in topic["groups"]:
            wait_rows(browser, f"[id='group-{group['name']}']",
                      [[number(p), number(c), number(lag)] for p, c, lag in group["partitions"]], [0, 2, 5],
                      f"group {group['name']} of {topic['name']}")
        browser.run("const p = document.getElementById('partition'); p.value = arguments[0];"
                    "p.dispatchEvent(new Event('change'));", str(topic["records_partition"]))
        wait_rows(browser, "#records", [[number(r["offset"]), r["key"], r["text"], r["headers"]] for r in topic["records"]],
                  [0, 2, 3, 4], f"the latest records of partition {topic['records_partition']}")
        wait_for(browser, "the charts", lambda: browser.run(TEXT, "#throughput-chart strong") == "Records published per second")
        if screenshots:
            browser.screenshot(os.path.join(screenshots, "console-topic.png"))
            browser.run("document.getElementById('records-view').scrollIntoView();")
            browser.screenshot(os.path.join(screenshots, "console-records.png"))
        browser.run("const s = document.getElementById('show-as'); s.value = 'hex';"
                    "s.dispatchEvent(new Event('change'));")
        wait_rows(browser, "#records", [[number(r["offset"]), r["hex"]] for r in topic["records"]], [0, 3],
                  "the latest records as hex")

        # A topic the broker does not have says so.
        browser.go(f"{url}#/topic/no-such-topic")
        wait_for(browser, "the page of a topic that does not exist",
                 lambda: (browser.run(TEXT, "#no-topic") or "").startswith("The broker has no topic of this name"))

        # Groups, dead letters, the cluster.
        browser.go(f"{url}#/groups")
        wait_rows(browser, "#groups", expected["groups"], [0, 1, 2, 3, 4, 5], "the groups")
        if screenshots:
            browser.screenshot(os.path.join(screenshots, "console-groups.png"))
        browser.go(f"{url}#/dead-letters")
        wait_rows(browser, "#dead-letters", expected["dead_letters"], [0, 1, 3], "the dead-letter topics")
        browser.go(f"{url}#/cluster")
        wait_for(browser, "the cluster page",
                 lambda: (browser.run(TEXT, "#alone") or "").startswith(expected["cluster"]))

        # Signing out: the sign-in form again.
        browser.run("document.getElementById('sign-out').click();")
        wait_for(browser, "the sign-in form after signing out", lambda: browser.run(TEXT, "#sign-in h1") == "Sign in")
    finally:
        browser.close()


def main():
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--screenshots"):
        sys.exit(__doc__)
    with open(sys.argv[1]) as source:
        expected = json.load(source)
    screenshots = sys.argv[3] if len(sys.argv) == 4 else None
    if screenshots:
        os.makedirs(screenshots, exist_ok=True)
    try:
        check(expected, screenshots)
    except AssertionError as failure:
        print(f"console check failed: {failure}", file=sys.stderr)
        sys.exit(1)
    print("console checks passed")


if __name__ == "__main__":
    main()
