// swift-tools-version: 6.2
// wisp's Swift half. No dependency outside the toolchain: the build machines cannot fetch packages.
import PackageDescription

let package = Package(
    name: "wisp",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "WispCore", targets: ["WispCore"]),
        .executable(name: "wisp-core", targets: ["wisp-core"]),
    ],
    targets: [
        .target(name: "WispCore", path: "swift/WispCore"),
        .executableTarget(name: "wisp-core", dependencies: ["WispCore"], path: "swift/wisp-core"),
        .testTarget(name: "WispCoreTests", dependencies: ["WispCore"], path: "tests/swift/WispCoreTests"),
    ],
    swiftLanguageModes: [.v6]
)
