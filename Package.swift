// swift-tools-version: 6.2
// wisp's Swift half: the domain (WispCore) on infrastructure of its own (WispInfrastructure: the
// JSON codec, the pipe loop and framing, the HTTP client, the linear regex, locks, the log sink),
// written by hand rather than taken from packages because no Swift package registry is
// reachable from the build machines: nothing outside the toolchain is depended on but the
// system's SQLite (durable threads): the SDK's SQLite3 module on macOS, libsqlite3 on Linux; and,
// on Linux for https only, OpenSSL 3, and for `--store` only, libpq 5, both loaded at run time
// (dlopen), never linked.
import PackageDescription

let package = Package(
    name: "wisp",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "WispCore", targets: ["WispCore"]),
        .executable(name: "wisp-core", targets: ["wisp-core"]),
    ],
    targets: [
        // Linux's system SQLite (Debian: libsqlite3-dev); macOS imports the SDK's SQLite3 instead.
        .systemLibrary(name: "CSQLite", path: "swift/CSQLite", providers: [.apt(["libsqlite3-dev"])]),
        // Release builds inline the codec's calls into WispCore as they were within one module
        // (the pipe's request decoding is on every call's path).
        .target(name: "WispInfrastructure", dependencies: [.target(name: "CSQLite", condition: .when(platforms: [.linux]))],
                path: "swift/WispInfrastructure",
                swiftSettings: [.unsafeFlags(["-cross-module-optimization"], .when(configuration: .release))]),
        .target(name: "WispCore", dependencies: ["WispInfrastructure"], path: "swift/WispCore"),
        .executableTarget(name: "wisp-core", dependencies: ["WispCore", "WispInfrastructure"], path: "swift/wisp-core",
                          plugins: ["WispVersion"]),
        // wisp-core's version, read at build time from pyproject.toml, its one declaration.
        .plugin(name: "WispVersion", capability: .buildTool(), dependencies: ["wisp-version-gen"],
                path: "swift/Plugins/WispVersion"),
        .executableTarget(name: "wisp-version-gen", path: "swift/Tools/wisp-version-gen"),
        .testTarget(name: "WispInfrastructureTests", dependencies: ["WispInfrastructure"], path: "tests/swift/WispInfrastructureTests"),
        .testTarget(name: "WispCoreTests", dependencies: ["WispCore", "WispInfrastructure"], path: "tests/swift/WispCoreTests"),
    ],
    swiftLanguageModes: [.v6]
)
