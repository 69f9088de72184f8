// Portable or guarded: /proc in a comment is prose.
let common = "/etc/hosts"
#if os(Linux)
let linuxOnly = "/proc/self/environ"
#else
let other = "/dev/null"
#endif
