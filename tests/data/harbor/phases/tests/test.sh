#!/bin/bash
# The verifier's allowlist: allowed.test is reached, denied.test is not, and the agent before
# it reached nothing.
fetch() { python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode().strip())" "$1" 2>/dev/null; }
allowed=$(fetch http://allowed.test/)
denied=$(fetch http://denied.test/ || echo refused)
agent=$(cat /app/agent.txt 2>/dev/null)
echo "allowed=$allowed denied=$denied agent=$agent"
if [ "$allowed" = "hello from allowed.test" ] && [ "$denied" = "refused" ] && [ "$agent" = "blocked" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
