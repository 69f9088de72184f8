#!/usr/bin/env python3
"""Turn Apple's FoundationModels .swiftinterface into one the Linux toolchain can build.

Used by scripts/check-apple.sh only. It reads the interface from outside the repo and
writes the filtered copy to a scratch directory; nothing here is a copy of Apple's text.

It strips only what cannot exist on Linux, and says on stderr what it stripped:
  - the module-flags that name an Apple target or need Objective-C (-target, -target-variant,
    -enable-objc-interop) and -library-level api (it turns "Foundation is not built with
    library evolution" into an error; Linux's Foundation is not);
  - `@objc` on `deinit` (there is no Objective-C runtime on Linux);
  - imports of Apple-only modules, and every declaration that names a type from one of them
    (the image-attachment initialisers of the 27 SDK: CGImage, CIImage, CVPixelBuffer, ...).
Everything else, including -user-module-version (which `canImport(_, _version:)` reads) and
the upcoming-feature flags, is kept as Apple wrote it.
"""
import re
import sys

# Modules that exist only on Apple platforms. An import of anything not in LINUX_MODULES or
# here stops the filter, so a new SDK's new dependency gets a person's attention.
APPLE_ONLY = {"CoreGraphics", "CoreImage", "CoreVideo", "ImageIO", "Darwin"}
LINUX_MODULES = {"Foundation", "Observation", "Swift", "_Concurrency", "_StringProcessing",
                 "_SwiftConcurrencyShims"}
# Qualified names that cannot resolve on Linux (CoreFoundation exists there, its CG types do not).
APPLE_ONLY_NAME = re.compile(r"\b(?:%s)::|\bCoreFoundation::CG" % "|".join(sorted(APPLE_ONLY)))
DROP_FLAGS_WITH_VALUE = {"-target", "-target-variant", "-library-level"}
DROP_FLAGS = {"-enable-objc-interop"}


def filter_flags(line: str) -> str:
    prefix = "// swift-module-flags:"
    words = line[len(prefix):].split()
    kept, i = [], 0
    while i < len(words):
        if words[i] in DROP_FLAGS_WITH_VALUE:
            i += 2
            continue
        if words[i] not in DROP_FLAGS:
            kept.append(words[i])
        i += 1
    return prefix + " " + " ".join(kept)


def filter_interface(text: str):
    lines = text.split("\n")
    out, removed = [], []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if line.startswith("// swift-module-flags:"):
            out.append(filter_flags(line))
        elif re.match(r"(public |@_exported |internal )?import \w+$", stripped):
            module = stripped.split()[-1]
            if module in APPLE_ONLY:
                removed.append(stripped)
            elif module not in LINUX_MODULES:
                sys.exit(f"fm_interface_filter: unknown import '{module}': add it to APPLE_ONLY or LINUX_MODULES")
            else:
                out.append(line)
        elif stripped == "@objc deinit":
            out.append(line.replace("@objc ", ""))
        elif APPLE_ONLY_NAME.search(line):
            # Drop this declaration: its attribute lines just above, and its body if it opens one.
            indent = len(line) - len(line.lstrip())
            while out and out[-1].strip().startswith("@") and len(out[-1]) - len(out[-1].lstrip()) == indent:
                out.pop()
            depth = line.count("{") - line.count("}")
            removed.append(stripped)
            while depth > 0:
                i += 1
                depth += lines[i].count("{") - lines[i].count("}")
        else:
            out.append(line)
        i += 1
    return "\n".join(out), removed


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: fm_interface_filter.py IN.swiftinterface OUT.swiftinterface")
    with open(sys.argv[1], encoding="utf-8") as f:
        text, removed = filter_interface(f.read())
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write(text)
    print(f"  stripped {len(removed)} Apple-only line(s):", file=sys.stderr)
    for r in removed:
        print(f"    - {r}", file=sys.stderr)


if __name__ == "__main__":
    main()
