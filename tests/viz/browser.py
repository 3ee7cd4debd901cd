"""Headless Chromium (Debian's package, tools/install_chromium.py) driven by Playwright, for the viewer's pages: the
launch flags and the checks every viewer page must pass (the `browser` fixture is in tests/conftest.py)."""

# No network: Chromium's background services would try to reach Google's hosts.
CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
]


def action_colours(page) -> list[str]:
  """The computed background colour of every action token on the page, in token order."""
  return page.eval_on_selector_all(".tok.act", "els => els.map(e => getComputedStyle(e).backgroundColor)")


def check_viewer_page(page, path, screenshot) -> dict:
  """Opens a viewer page and checks what every page must show; returns what it found for further checks.

  Every action token has a colour (its advantage's, never transparent), the legend shows the active method's
  scale, there is one tab per method, and switching tabs recolours the tokens where the methods' advantages
  differ (each tab's colours are checked against its advantages: white at 0, red above, blue below)."""
  errors = []
  page.on("pageerror", lambda e: errors.append(str(e)))
  page.goto(path.as_uri())
  data = page.evaluate("D")
  actions = [i for i, a in enumerate(data["action"]) if a]
  assert page.locator(".tok").count() == len(data["token_ids"])
  assert page.locator(".tok.act").count() == len(actions) > 0
  assert page.locator("#legendbar").is_visible() and page.locator("#lo").inner_text().startswith("-")
  tabs = page.locator(".tab")
  assert tabs.count() == len(data["methods"]) >= 1
  page.screenshot(path=str(screenshot), full_page=True)
  assert screenshot.stat().st_size > 10_000
  by_method = {}
  for k, m in enumerate(data["methods"]):
    tabs.nth(k).click()
    assert "active" in (tabs.nth(k).get_attribute("class") or "")
    colours = action_colours(page)
    assert all(c.startswith("rgb(") for c in colours), colours[:4]  # rgba(0, 0, 0, 0) would be no colour
    for c, i in zip(colours, actions):
      r, g, b = (int(x) for x in c[4:-1].split(","))
      a = m["adv"][i]
      if a is None or a == 0:
        assert (r, g, b) == (255, 255, 255)
      elif a > 0:
        assert r >= g and r >= b and (r, g, b) != (255, 255, 255)
      else:
        assert b >= r and b >= g and (r, g, b) != (255, 255, 255)
    assert page.locator("#hi").inner_text() == f"+{m['scale']:.4f}"
    by_method[m["name"]] = colours
  assert not errors, errors
  return {"data": data, "colours": by_method}
