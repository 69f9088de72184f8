import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The directories model tools may read, and the one check every path passes through:
/// resolve it fully (symlinks included), then refuse it unless it lands inside a root.
public struct Roots: Sendable, Equatable {
    /// Canonical absolute paths, without a trailing slash (except "/").
    public let paths: [String]

    /// Roots that do not exist are left out (with the reason in `skipped`).
    public init(_ directories: [String]) {
        var kept: [String] = []
        // A set, not `kept.contains`: that was quadratic (20,000 client roots took seconds).
        var seen: Set<String> = []
        for d in directories {
            if let real = Roots.realPath(d), Roots.isDirectory(real), seen.insert(real).inserted { kept.append(real) }
        }
        paths = kept
    }

    /// The real path of `path` inside a root, or a refusal the model can act on.
    /// Relative paths are taken from the first root.
    public func resolve(_ path: String) throws(WispError) -> String {
        guard let first = paths.first else { throw WispError(.invalidArgument, "no readable roots are configured (start wisp with --root DIR)") }
        guard !path.utf8.contains(0) else { throw WispError(.invalidArgument, "path contains a NUL byte") }
        guard !path.isEmpty else { throw WispError(.invalidArgument, "path is empty") }
        let joined = path.hasPrefix("/") ? path : (first == "/" ? "/" + path : first + "/" + path)
        guard let real = Roots.realPath(joined) else {
            throw WispError(.invalidArgument, "\(path): no such file or directory")
        }
        guard contains(real) else {
            throw WispError(.invalidArgument, "\(path): outside the readable roots (\(paths.joined(separator: ", ")))")
        }
        return real
    }

    public func contains(_ real: String) -> Bool {
        paths.contains { root in root == "/" || real == root || real.hasPrefix(root + "/") }
    }

    /// How a resolved path appears to the model: relative to its root when it can be.
    public func display(_ real: String) -> String {
        for root in paths where real.hasPrefix(root + "/") {
            return String(real.dropFirst(root.count + 1))
        }
        return real
    }

    static func realPath(_ path: String) -> String? {
        guard let p = realpath(path, nil) else { return nil }
        defer { free(p) }
        return String(cString: p)
    }

    static func isDirectory(_ path: String) -> Bool {
        var s = stat()
        return stat(path, &s) == 0 && (s.st_mode & S_IFMT) == S_IFDIR
    }
}
