#!/bin/bash
if [ "$(cat /app/outcome.txt 2>/dev/null)" = "blocked" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
