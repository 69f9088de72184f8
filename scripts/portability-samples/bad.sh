#!/bin/sh
# Deliberately non-portable.
n=$(nproc)  # BAD
timeout 5 true  # BAD
