#!/usr/bin/env bash
# make check-apple: typecheck the apple backend on Linux against Apple's FoundationModels SDK
# interfaces, one typecheck-only module per interface.
#
# For each FoundationModels-*.swiftinterface in $WISP_APPLE_SDK_DIR (default ../shared/reference/sdk):
#   1. filter it (scripts/fm_interface_filter.py: strips only what cannot exist on Linux) into a
#      scratch dir, and build a FoundationModels.swiftmodule from it with
#      `swiftc -frontend -compile-module-from-interface` (declarations only: no code, no framework);
#   2. check which side of the 27-SDK gate `canImport(FoundationModels, _version: 2.0)` takes,
#      and that it is the side this interface's module version calls for;
#   3. build WispInfrastructure's module (its SQLite code on the macOS branch, against the system's
#      sqlite3.h presented as the SDK's SQLite3 module; its HTTP client's URLSession transport, the
#      one Apple's systems use, against swift-corelibs-foundation's URLSession), then WispCore against it (every source, so
#      canImport(FoundationModels) is true wherever it is asked) with -D WISP_CHECK_APPLE, and
#      typecheck tests/swift/WispCoreTests/AppleBackendTests.swift.
# Any error, or any warning in the apple backend (Backends/Apple/*.swift) or AppleBackendTests.swift, fails the check.
# The interfaces are read where they are; nothing is copied into the repo. Scratch:
# $WISP_CHECK_APPLE_DIR (default .build/check-apple), never the package's own build products.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
sdk=${WISP_APPLE_SDK_DIR:-$root/../shared/reference/sdk}
scratch=${WISP_CHECK_APPLE_DIR:-$root/.build/check-apple}
swiftc=${SWIFTC:-swiftc}

if [ "$(uname -s)" = Darwin ]; then
    echo "check-apple: SKIPPED on macOS: the real SDK compiles the apple backend in 'swift build'."
    exit 0
fi
shopt -s nullglob
interfaces=("$sdk"/FoundationModels-*.swiftinterface)
if [ ${#interfaces[@]} -eq 0 ]; then
    echo "check-apple: SKIPPED: no FoundationModels-*.swiftinterface in $sdk (set WISP_APPLE_SDK_DIR to check the apple backend)."
    exit 0
fi

cd "$root"
infra_sources=()
while IFS= read -r f; do infra_sources+=("$f"); done < <(find swift/WispInfrastructure -name '*.swift' | sort)
sources=()
while IFS= read -r f; do sources+=("$f"); done < <(find swift/WispCore -name '*.swift' | sort)
tests=tests/swift/WispCoreTests/AppleBackendTests.swift
failed=0
# The macOS SDK's SQLite3 module, stood in for by the system's sqlite3.h under that name, so that
# WispInfrastructure's SQLite code is typechecked on its macOS branch (`canImport(SQLite3)`).
sqlite=$scratch/sqlite3
mkdir -p "$sqlite"
printf '#include <sqlite3.h>\n' >"$sqlite/shim.h"
printf 'module SQLite3 [system] {\n    header "shim.h"\n    link "sqlite3"\n    export *\n}\n' >"$sqlite/module.modulemap"

for iface in "${interfaces[@]}"; do
    label=$(basename "$iface" .swiftinterface); label=${label#FoundationModels-}
    dir=$scratch/$label
    rm -rf "$dir"; mkdir -p "$dir"
    log=$dir/log.txt
    echo "check-apple: $label ($iface)"

    python3 scripts/fm_interface_filter.py "$iface" "$dir/FoundationModels.swiftinterface"
    if ! "$swiftc" -frontend -compile-module-from-interface -module-name FoundationModels \
            "$dir/FoundationModels.swiftinterface" -o "$dir/FoundationModels.swiftmodule" >"$log" 2>&1; then
        cat "$log"; echo "check-apple: $label: FAILED to build the FoundationModels module from the interface"
        failed=1; continue
    fi

    # The 27-only code is compiled exactly when the SDK's FoundationModels is 2.x.
    version=$(sed -n 's/.*-user-module-version \([0-9.]*\).*/\1/p' "$iface" | head -1)
    want=26; [ "${version%%.*}" -ge 2 ] && want=27
    printf 'import FoundationModels\n#if canImport(FoundationModels, _version: 2.0)\n#warning("gate=27")\n#else\n#warning("gate=26")\n#endif\n' >"$dir/gate.swift"
    got=$("$swiftc" -typecheck -I "$dir" "$dir/gate.swift" 2>&1 | sed -n 's/.*warning: gate=\([0-9]*\).*/\1/p' | head -1)
    if [ "$got" != "$want" ]; then
        echo "check-apple: $label: FAILED: module version $version should select the $want branch, the gate selected '${got:-nothing}'"
        failed=1; continue
    fi
    echo "  module version $version: the 27-SDK branch (canImport(FoundationModels, _version: 2.0)) is $([ "$want" = 27 ] && echo compiled || echo skipped)"

    mkdir -p "$dir/infra"
    if ! "$swiftc" -emit-module -module-name WispInfrastructure -parse-as-library -swift-version 6 -enable-testing \
            -D WISP_CHECK_APPLE -I "$sqlite" -emit-module-path "$dir/infra/WispInfrastructure.swiftmodule" "${infra_sources[@]}" >"$log" 2>&1; then
        cat "$log"; echo "check-apple: $label: FAILED: WispInfrastructure (which WispCore imports) does not typecheck"
        failed=1; continue
    fi
    if ! "$swiftc" -emit-module -module-name WispCore -parse-as-library -swift-version 6 -enable-testing \
            -D WISP_CHECK_APPLE -I "$dir" -I "$dir/infra" -I "$sqlite" -emit-module-path "$dir/WispCore.swiftmodule" \
            "${sources[@]}" >"$log" 2>&1; then
        cat "$log"; echo "check-apple: $label: FAILED: WispCore (with the apple backend) does not typecheck"
        failed=1; continue
    fi
    if [ -f "$tests" ] && ! "$swiftc" -typecheck -swift-version 6 -D WISP_CHECK_APPLE -I "$dir" -I "$dir/infra" -I "$sqlite" "$tests" >>"$log" 2>&1; then
        cat "$log"; echo "check-apple: $label: FAILED: $tests does not typecheck"
        failed=1; continue
    fi
    if grep -E '(Backends/Apple/[A-Za-z]+|AppleBackendTests)\.swift:[0-9]+:[0-9]+: warning' "$log"; then
        echo "check-apple: $label: FAILED: warnings in the apple backend (above)"
        failed=1; continue
    fi
    echo "  ok: Backends/Apple/*.swift$([ -f "$tests" ] && echo " and AppleBackendTests.swift") typecheck against $label"

    # 4. Availability, which Linux ignores for macOS: the same build with every macOS availability
    #    moved onto the Swift runtime domain (the filter's --swift-availability), which Linux
    #    enforces, the interface at its own OS version and wisp at macOS 26.0, FoundationModels'
    #    floor (Swift 6.3.1 cannot refine an @available(Swift 26.0) context with #available, so
    #    wisp's 26.0 annotations are dropped, and whether code for macOS 15 guards the backend with
    #    #available(macOS 26.0, *) is not checked). A 26.4 or 27 API used without `#available`
    #    fails here as it would on a Mac. Line numbers are kept.
    av=$dir/availability
    mkdir -p "$av"
    python3 scripts/fm_interface_filter.py --swift-availability "$iface" "$av/FoundationModels.swiftinterface" 2>/dev/null
    av_sources=()
    for f in "${sources[@]}" $([ -f "$tests" ] && echo "$tests"); do
        mkdir -p "$av/$(dirname "$f")"
        python3 scripts/fm_interface_filter.py --swift-availability=26.0 "$f" "$av/$f"
        [ "$f" != "$tests" ] && av_sources+=("$av/$f")
    done
    # WispInfrastructure (nothing of FoundationModels in it) is the module step 3 built.
    av_flags=(-swift-version 6 -D WISP_CHECK_APPLE -I "$av" -I "$dir/infra" -I "$sqlite"
              -enable-experimental-feature StandaloneSwiftAvailability -Xfrontend -min-swift-runtime-version -Xfrontend 26.0)
    if ! "$swiftc" -frontend -compile-module-from-interface -module-name FoundationModels \
            "$av/FoundationModels.swiftinterface" -o "$av/FoundationModels.swiftmodule" >"$log" 2>&1 ||
       ! "$swiftc" -emit-module -module-name WispCore -parse-as-library -enable-testing "${av_flags[@]}" \
            -emit-module-path "$av/WispCore.swiftmodule" "${av_sources[@]}" >>"$log" 2>&1 ||
       { [ -f "$tests" ] && ! "$swiftc" -typecheck "${av_flags[@]}" "$av/$tests" >>"$log" 2>&1; }; then
        cat "$log"; echo "check-apple: $label: FAILED: availability (macOS versions checked on the Swift runtime domain, from macOS 26.0)"
        failed=1; continue
    fi
    echo "  ok: availability: every 26.4+/27.0 API is behind #available (macOS versions checked on the Swift runtime domain, from macOS 26.0)"
done

if [ $failed -ne 0 ]; then
    echo "check-apple: FAILED"
    exit 1
fi
echo "check-apple: passed against ${#interfaces[@]} interface(s)."
