#!/bin/bash
for i in $(seq 1 100); do
  if python3 -c 'import urllib.request; print(urllib.request.urlopen("http://web:8000/answer", timeout=2).read().decode().strip())' > /app/answer.txt 2>/dev/null; then
    exit 0
  fi
  sleep 0.2
done
exit 1
