"""Install Debian's Chromium for the credit viewer's browser test (tests/viz/test_viewer_browser.py).

The test opens a page of `jaxcredit viz` in headless Chromium through Playwright (the `test` extra) and checks its
DOM and a screenshot. Playwright's own browser download needs the network; Debian's package does not:

    python tools/install_chromium.py          # apt-get install chromium (as root, or through sudo -n)

Does nothing when `chromium` is already on PATH. Exits 1 with what to do when it cannot install.
"""

import os
import shutil
import subprocess
import sys


def main() -> int:
  found = shutil.which("chromium")
  if found:
    print(f"install_chromium: {found} is installed")
    return 0
  if not shutil.which("apt-get"):
    print(
      "install_chromium: no apt-get here; install Chromium from your system's packages so that `chromium` is on "
      "PATH (or set JAXCREDIT_SKIP_BROWSER=1 to skip the viewer's browser test)",
      file=sys.stderr,
    )
    return 1
  prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
  env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
  install = prefix + ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
  if subprocess.run(install, env=env).returncode != 0:
    subprocess.run(prefix + ["apt-get", "update", "-q"], env=env)
    if subprocess.run(install, env=env).returncode != 0:
      print("install_chromium: apt-get could not install chromium (see above)", file=sys.stderr)
      return 1
  print(f"install_chromium: {shutil.which('chromium')} installed")
  return 0


if __name__ == "__main__":
  sys.exit(main())
