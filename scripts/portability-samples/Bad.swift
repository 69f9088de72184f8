let cases = [
    ("proc self", "/proc/self/environ"),  // BAD
]
#if os(macOS)
let stillBad = "/proc/self/environ"  // BAD
#endif
