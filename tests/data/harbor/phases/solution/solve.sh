#!/bin/bash
if python3 -c "import urllib.request; urllib.request.urlopen('http://allowed.test/', timeout=3)" 2>/dev/null; then
  echo reached > /app/agent.txt
else
  echo blocked > /app/agent.txt
fi
