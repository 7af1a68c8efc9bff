#!/bin/bash
# Tries the world by name and by the address the world serves it on.
outcome=blocked
for url in http://allowed.test/ http://203.0.113.10/; do
  if python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=3)" "$url" 2>/dev/null; then
    outcome="reached $url"
  fi
done
echo "$outcome" > /app/outcome.txt
