#!/bin/sh
if [ "$(uname -s)" = Linux ]; then
    n=$(nproc)
    timeout 5 true
fi
