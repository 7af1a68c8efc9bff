"""A static asset: read-only at /static/tests in the sandbox."""
import subprocess
import sys

out = subprocess.run([sys.executable, "-c", "print('hello')"], capture_output=True, text=True)
assert out.stdout == "hello\n", out
print("ok")
