import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The directories model tools (and `respond`'s `files`) may read, and the one way anything
/// under them is opened: `open(_:)`, which walks the path one component at a time from a
/// descriptor, so what is read is what was checked even while someone swaps names under it.
public struct Roots: Sendable, Equatable {
    /// Canonical absolute paths, without a trailing slash (except "/").
    public let paths: [String]
    /// A regular file with more than one hard link may be the same file as one outside the
    /// roots, which no path check can see; such files are refused unless this is set.
    public let allowHardLinks: Bool

    /// Roots that do not exist are left out.
    public init(_ directories: [String], allowHardLinks: Bool = false) {
        var kept: [String] = []
        // A set, not `kept.contains`: that was quadratic (20,000 client roots took seconds).
        var seen: Set<String> = []
        for d in directories {
            if let real = Roots.realPath(d), Roots.isDirectory(real), seen.insert(real).inserted { kept.append(real) }
        }
        paths = kept
        self.allowHardLinks = allowHardLinks
    }

    /// The same roots with more directories (a client's roots) after these.
    public func adding(_ directories: [String]) -> Roots {
        Roots(paths + directories, allowHardLinks: allowHardLinks)
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

    // MARK: the confined open

    /// A file or directory opened by `open(_:)`. Everything read from it goes through `fd`,
    /// the descriptor that was checked, never through its name again.
    public final class Opened {
        public let fd: Int32
        /// Its canonical path when it was opened.
        public let real: String
        public let isDirectory: Bool

        init(fd: Int32, real: String, isDirectory: Bool) {
            self.fd = fd
            self.real = real
            self.isDirectory = isDirectory
        }

        deinit { close(fd) }

        /// Up to `limit` bytes, and whether that was the whole file.
        public func read(upTo limit: Int) -> ([UInt8], Bool) {
            var data = [UInt8]()
            var chunk = [UInt8](repeating: 0, count: 64 * 1024)
            while data.count <= limit {
                let n = chunk.withUnsafeMutableBytes { systemRead(fd, $0.baseAddress!, $0.count) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return (data, true) }
                data.append(contentsOf: chunk[0..<n])
            }
            return (Array(data.prefix(limit)), false)
        }

        /// The names in this directory (without . and ..), unsorted; empty if it cannot be read.
        public func entries() -> [String] {
            // fdopendir takes over the descriptor it is given: hand it a copy, rewound.
            let copy = dup(fd)
            guard copy >= 0 else { return [] }
            guard let dir = fdopendir(copy) else { close(copy); return [] }
            defer { closedir(dir) }
            rewinddir(dir)
            var names: [String] = []
            while let entry = readdir(dir) {
                // d_name is a fixed-size C array on both systems (256 bytes on Linux, 1024 on macOS).
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
                }
                if name != "." && name != ".." { names.append(name) }
            }
            return names
        }

        /// The kind of entry `name` in this directory, without following a symlink (S_IFDIR, S_IFREG, …).
        public func kind(of name: String) -> mode_t? {
            var s = stat()
            guard fstatat(fd, name, &s, AT_SYMLINK_NOFOLLOW) == 0 else { return nil }
            return s.st_mode & S_IFMT
        }
    }

    /// Symlinks followed in one walk before it is taken for a loop (Linux's and macOS's own limit).
    static let maxSymlinks = 40

    /// Opens `path` (relative paths from the first root) if it is a regular file or a directory
    /// inside a root, or refuses it with a message the caller can act on. No symlink is trusted
    /// by name: each component is opened from its parent's descriptor with O_NOFOLLOW, a symlink
    /// is read and its target walked the same way, and nothing outside the roots but the roots'
    /// own ancestors is ever opened (devices, FIFOs and sockets are refused before any open).
    public func open(_ path: String) throws(WispError) -> Opened {
        guard let first = paths.first else { throw WispError(.invalidArgument, "no readable roots are configured (start wisp with --root DIR)") }
        guard !path.utf8.contains(0) else { throw WispError(.invalidArgument, "path contains a NUL byte") }
        guard !path.isEmpty else { throw WispError(.invalidArgument, "path is empty") }
        let joined = path.hasPrefix("/") ? path : (first == "/" ? "/" + path : first + "/" + path)

        let walk = Walk()
        var todo: [Substring] = []
        try walk.start(joined, roots: self, todo: &todo, shown: path)
        var symlinks = 0
        while let name = todo.popLast() {
            if name == "." || name.isEmpty { continue }
            if name == ".." { try walk.up(shown: path); continue }
            let isLast = !todo.contains { $0 != "." && !$0.isEmpty }
            let next = walk.path == "/" ? "/" + name : walk.path + "/" + name
            let inside = contains(next)
            let towardARoot = paths.contains { $0.hasPrefix(next + "/") }
            var s = stat()
            guard fstatat(walk.fd, String(name), &s, AT_SYMLINK_NOFOLLOW) == 0 else {
                // Outside the roots, even whether a name exists is not the caller's to learn.
                guard inside || towardARoot else { throw outside(path) }
                throw Self.failure(path, errno)
            }
            switch s.st_mode & S_IFMT {
            case S_IFLNK:
                symlinks += 1
                guard symlinks <= Self.maxSymlinks else {
                    throw WispError(.invalidArgument, "\(path): no such file or directory (too many levels of symbolic links)")
                }
                guard let target = Self.readLink(walk.fd, String(name)) else { throw Self.failure(path, errno) }
                if target.hasPrefix("/") {
                    try walk.start(target, roots: self, todo: &todo, shown: path)
                } else {
                    todo.append(contentsOf: target.split(separator: "/", omittingEmptySubsequences: true).reversed())
                }
            case S_IFDIR:
                guard inside || (towardARoot && !isLast) else { throw outside(path) }
                let fd = openat(walk.fd, String(name), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
                guard fd >= 0 else {
                    // Swapped for a symlink since the fstatat: look again (bounded like any symlink).
                    if errno == ELOOP || errno == ENOTDIR, symlinks < Self.maxSymlinks { symlinks += 1; todo.append(name); continue }
                    throw Self.failure(path, errno)
                }
                walk.push(fd, next)
            case S_IFREG:
                guard inside else { throw outside(path) }
                guard isLast else { throw WispError(.invalidArgument, "\(path): \(name) is a file, not a directory") }
                let fd = openat(walk.fd, String(name), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)
                guard fd >= 0 else {
                    if errno == ELOOP, symlinks < Self.maxSymlinks { symlinks += 1; todo.append(name); continue }
                    throw Self.failure(path, errno)
                }
                let opened = Opened(fd: fd, real: next, isDirectory: false)
                try checkRegular(opened, shown: path)
                return opened
            default:
                guard inside else { throw outside(path) }
                throw WispError(.invalidArgument, "\(path) is not a regular file (device, FIFO or socket); refused")
            }
        }
        guard contains(walk.path) else { throw outside(path) }
        return walk.takeTop()
    }

    /// Opens entry `name` of `dir` (a directory this walk already holds) if it is a directory or
    /// a readable regular file; symlinks are not followed (a walk could leave the roots or loop).
    func openChild(_ dir: Opened, _ name: String) throws(WispError) -> Opened? {
        let real = dir.real == "/" ? "/" + name : dir.real + "/" + name
        switch dir.kind(of: name) {
        case S_IFDIR?:
            let fd = openat(dir.fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            return fd >= 0 ? Opened(fd: fd, real: real, isDirectory: true) : nil
        case S_IFREG?:
            let fd = openat(dir.fd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { return nil }
            let opened = Opened(fd: fd, real: real, isDirectory: false)
            try checkRegular(opened, shown: display(real))
            return opened
        default:
            return nil
        }
    }

    /// What was opened is a regular file (it may have been swapped since it was looked at)
    /// with one link, or hard links are allowed.
    private func checkRegular(_ opened: Opened, shown: String) throws(WispError) {
        var f = stat()
        guard fstat(opened.fd, &f) == 0, (f.st_mode & S_IFMT) == S_IFREG else {
            throw WispError(.invalidArgument, "\(shown) is not a regular file; refused")
        }
        if f.st_nlink > 1 && !allowHardLinks {
            throw WispError(.invalidArgument, Self.hardLinkRefusal(shown, links: Int(f.st_nlink)))
        }
    }

    static func hardLinkRefusal(_ shown: String, links: Int) -> String {
        "\(shown) has \(links) hard links, so it may be a file from outside the readable roots; refused (start wisp with --allow-hardlinks, or WISP_ALLOW_HARDLINKS=1, to read hard-linked files)"
    }

    private func outside(_ path: String) -> WispError {
        WispError(.invalidArgument, "\(path): outside the readable roots (\(paths.joined(separator: ", ")))")
    }

    private static func failure(_ path: String, _ code: Int32) -> WispError {
        switch code {
        case ENOENT, ENOTDIR: WispError(.invalidArgument, "\(path): no such file or directory")
        case EACCES, EPERM: WispError(.invalidArgument, "\(path): permission denied")
        default: WispError(.invalidArgument, "\(path): cannot open (\(String(cString: strerror(code))))")
        }
    }

    private static func readLink(_ dir: Int32, _ name: String) -> String? {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = buffer.withUnsafeMutableBufferPointer { b in
            b.baseAddress!.withMemoryRebound(to: CChar.self, capacity: b.count) { readlinkat(dir, name, $0, b.count - 1) }
        }
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n], as: UTF8.self)
    }

    /// The directories a walk holds open, innermost last; `..` steps back through them
    /// rather than through the file system.
    private final class Walk {
        private var stack: [(fd: Int32, path: String)] = []

        deinit { for entry in stack { close(entry.fd) } }

        var fd: Int32 { stack[stack.count - 1].fd }
        var path: String { stack[stack.count - 1].path }

        /// Starts (or restarts, at an absolute symlink) from the deepest root the absolute path
        /// `absolute` names literally, else from "/"; its other components go onto `todo`.
        func start(_ absolute: String, roots: Roots, todo: inout [Substring], shown: String) throws(WispError) {
            let components = absolute.split(separator: "/", omittingEmptySubsequences: true)
            var base = "/"
            var used = 0
            for root in roots.paths {
                let r = root.split(separator: "/", omittingEmptySubsequences: true)
                if r.count >= used, components.count >= r.count, Array(components.prefix(r.count)) == r {
                    base = root
                    used = r.count
                }
            }
            try reset(to: base, shown: shown)
            todo.append(contentsOf: components.dropFirst(used).reversed())
        }

        /// `..`: the parent held below, or, above the first directory held (a root or "/",
        /// canonical, so its parent is its lexical parent), that parent opened by path.
        func up(shown: String) throws(WispError) {
            if stack.count > 1 {
                close(stack.removeLast().fd)
            } else if path != "/" {
                let parent = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
                try reset(to: parent.isEmpty ? "/" : parent, shown: shown)
            }
        }

        func push(_ fd: Int32, _ path: String) { stack.append((fd, path)) }

        /// The innermost directory, handed over to the caller.
        func takeTop() -> Opened {
            let top = stack.removeLast()
            return Opened(fd: top.fd, real: top.path, isDirectory: true)
        }

        private func reset(to directory: String, shown: String) throws(WispError) {
            for entry in stack { close(entry.fd) }
            stack.removeAll()
            let fd = systemOpen(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard fd >= 0 else { throw WispError(.invalidArgument, "\(shown): cannot open \(directory) (\(String(cString: strerror(errno))))") }
            stack.append((fd, directory))
        }
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

// The libc calls under names that members called open/read cannot shadow.
private func systemOpen(_ path: String, _ flags: Int32) -> Int32 { open(path, flags) }
private func systemRead(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> Int { read(fd, buffer, count) }
