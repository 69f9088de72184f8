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

With --swift-availability (on an interface or on wisp's own sources) it also moves every macOS
availability onto the `Swift` runtime domain, which the Linux compiler does check
(-enable-experimental-feature StandaloneSwiftAvailability): `macOS 26.4` becomes `Swift 26.4`,
other Apple platforms are dropped. With =BASELINE (for wisp's sources) declarations' availability
up to BASELINE is dropped instead, and the sources are built with -min-swift-runtime-version
BASELINE: Swift 6.3.1 does not refine an `@available(Swift …)` context further with
`#available(Swift …)`, so the apple backend's own `@available(macOS 26.0, *)` must go for its
26.4 and 27.0 checks to be seen. A 26.4 or 27.0 API used without `#available` then fails as it
would on a Mac.
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


OTHER_PLATFORMS = {"iOS", "tvOS", "watchOS", "visionOS", "macCatalyst", "iOSApplicationExtension",
                   "macOSApplicationExtension", "macCatalystApplicationExtension", "visionOSApplicationExtension"}
AVAILABILITY = re.compile(r"(@available|#available|#unavailable|@backDeployed)\(")


def split_args(body: str):
    """Top-level comma-separated arguments, ignoring commas and parentheses inside strings."""
    args, depth, cur, in_str, i = [], 0, "", False, 0
    while i < len(body):
        c = body[i]
        if in_str:
            cur += c
            if c == "\\":
                cur += body[i + 1]; i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True; cur += c
        elif c in "([":
            depth += 1; cur += c
        elif c in ")]":
            depth -= 1; cur += c
        elif c == "," and depth == 0:
            args.append(cur.strip()); cur = ""
        else:
            cur += c
        i += 1
    if cur.strip():
        args.append(cur.strip())
    return args


def end_of_call(text: str, start: int) -> int:
    """Index of the ')' closing the '(' just before `start`, skipping string literals."""
    depth, i, in_str = 1, start, False
    while True:
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1


def version(v: str):
    return tuple(int(x) for x in v.split("."))


def rewrite_availability(kind: str, args, baseline=None):
    """The attribute on the Swift domain, or None to drop it (it says nothing about macOS)."""
    if kind == "@backDeployed":
        versions = [args[0][len("before:"):]] + args[1:]
        mac = [v.strip() for v in versions if v.strip().startswith("macOS ")]
        return f"@backDeployed(before: Swift {mac[0].split()[1]})" if mac else None
    first = args[0].split()
    if len(first) == 1 and first[0] != "*":  # long form: @available(macOS, introduced: ..., deprecated: ...)
        if first[0] == "macOS":
            # `obsoleted:` is left out: on the Swift domain it also hides the declaration from the
            # interface's own obsoleted code (only SystemLanguageModel.Adapter, which wisp does not use).
            rest = [a for a in args[1:] if not a.startswith("obsoleted:")]
            return f"{kind}(" + ", ".join(["Swift"] + rest) + ")" if rest else None
        if first[0] in OTHER_PLATFORMS:
            return None
        return f"{kind}(" + ", ".join(args) + ")"
    if first == ["*"]:  # @available(*, unavailable, ...)
        return f"{kind}(" + ", ".join(args) + ")"
    kept = []
    for a in args:
        words = a.split()
        if words[0] == "macOS" and kind == "@available" and baseline and version(words[1]) <= version(baseline):
            return None  # always true at the baseline deployment target
        if words[0] == "macOS":
            kept.append("Swift " + words[1])
        elif words[0] == "*" or words[0] not in OTHER_PLATFORMS:
            kept.append(a)
    if not any(k.startswith("Swift ") for k in kept):
        return None if kind == "@available" else f"{kind}(Swift 1.0, *)"
    return f"{kind}(" + ", ".join(kept) + ")"


def to_swift_availability(text: str, min_version=None, baseline=None) -> str:
    out, pos = [], 0
    for m in AVAILABILITY.finditer(text):
        if m.start() < pos:
            continue
        end = end_of_call(text, m.end())
        new = rewrite_availability(m.group(1), split_args(text[m.end():end]), baseline)
        out.append(text[pos:m.start()])
        out.append(new if new is not None else "")
        pos = end + 1
    out.append(text[pos:])
    text = "".join(out)
    if min_version:  # the interface's own target: inside it, everything up to its OS version is available
        text = text.replace("-module-name FoundationModels", "-enable-experimental-feature StandaloneSwiftAvailability "
                            f"-min-swift-runtime-version {min_version} -module-name FoundationModels", 1)
    return text


def main():
    args = sys.argv[1:]
    swift_availability = any(a.startswith("--swift-availability") for a in args)
    baseline = next((a.split("=", 1)[1] for a in args if a.startswith("--swift-availability=")), None)
    args = [a for a in args if not a.startswith("--swift-availability")]
    if len(args) != 2:
        sys.exit("usage: fm_interface_filter.py [--swift-availability[=BASELINE]] IN OUT")
    with open(args[0], encoding="utf-8") as f:
        text = f.read()
    removed, target = [], None
    if args[0].endswith(".swiftinterface"):
        found = re.search(r"-target \S+-apple-macos([0-9.]+)", text)
        target = found.group(1) if found else None
        text, removed = filter_interface(text)
    if swift_availability:
        text = to_swift_availability(text, target, baseline)
    with open(args[1], "w", encoding="utf-8") as f:
        f.write(text)
    if not args[0].endswith(".swiftinterface"):
        return
    print(f"  stripped {len(removed)} Apple-only line(s):", file=sys.stderr)
    for r in removed:
        print(f"    - {r}", file=sys.stderr)


if __name__ == "__main__":
    main()
