#!/usr/bin/env bash
# Fail early, with a clear message, when Python 3.11 or Java 17+ (for Spark) is missing.
set -euo pipefail
python=${1:-python3.11}
if ! command -v "$python" >/dev/null 2>&1; then
  echo "segrep: Python 3.11 is required but '$python' was not found on PATH (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != "3.11" ]; then
  echo "segrep: Python 3.11 is required, but '$python' is Python $version (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
if ! command -v java >/dev/null 2>&1; then
  echo "segrep: Java 17 or newer is required for Spark, but 'java' was not found on PATH (install openjdk-17-jre-headless)" >&2
  exit 1
fi
java_major=$(java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print v[1]; exit}')
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
  echo "segrep: Java 17 or newer is required for Spark, found: $(java -version 2>&1 | head -n1)" >&2
  exit 1
fi
