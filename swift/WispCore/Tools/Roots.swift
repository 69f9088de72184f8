#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The directories model tools (and `respond`'s `files`) may read, and the one way anything
/// under them is opened: `open(_:)`, which walks the path one component at a time from a
/// descriptor, so what is read is what was checked even while someone swaps names under it.
/// Every name in it is an `FSPath`: bytes, as the OS gave them.
public struct Roots: Sendable, Equatable {
    /// Canonical absolute paths (realpath's bytes), without a trailing slash (except "/").
    public let directories: [FSPath]
    /// A regular file with more than one hard link may be the same file as one outside the
    /// roots, which no path check can see; such files are refused unless this is set.
    public let allowHardLinks: Bool

    /// The roots as text, for messages.
    public var paths: [String] { directories.map(\.description) }

    /// Roots that do not exist are left out. Each costs a `realpath` and a `stat`: build
    /// Roots off the pipe loop (a hung mount blocks both).
    public init(_ directories: [String], allowHardLinks: Bool = false) {
        self.init(resolved: [], adding: directories, allowHardLinks: allowHardLinks)
    }

    private init(resolved: [FSPath], adding more: [String], allowHardLinks: Bool) {
        var kept = resolved
        // A set, not `kept.contains`: that was quadratic (20,000 client roots took seconds).
        var seen = Set(resolved)
        for d in more {
            if let real = Roots.realPath(FSPath(d)), Roots.isDirectory(real), seen.insert(real).inserted {
                kept.append(real)
            }
        }
        self.directories = kept
        self.allowHardLinks = allowHardLinks
    }

    /// The same roots with more directories (a client's roots) after these; only the new ones are resolved.
    public func adding(_ more: [String]) -> Roots {
        Roots(resolved: directories, adding: more, allowHardLinks: allowHardLinks)
    }

    public func contains(_ real: FSPath) -> Bool {
        directories.contains { real.isWithin($0) }
    }

    /// How a resolved path appears to the model: relative to its root when it can be.
    public func display(_ real: FSPath) -> String {
        for root in directories where root != .root && real.isBelow(root) {
            return String(decoding: real.bytes[(root.bytes.count + 1)...], as: UTF8.self)
        }
        return real.description
    }

    // MARK: bounds

    /// A path longer than the system takes (PATH_MAX counts the NUL) is refused as the OS would.
    public static let maxPathBytes = Int(PATH_MAX) - 1
    /// Components one open walks in all, the path's and its symlinks' targets' (at most
    /// `maxSymlinks` of them), "." and ".." included: with the length bound, the walk's cost.
    public static let maxComponents = 4096
    /// Symlinks followed in one walk before it is taken for a loop (Linux's and macOS's own limit).
    static let maxSymlinks = 40
    /// Bytes of a caller's path quoted in an error: enough to recognise it, never the whole of a crafted one.
    static let shownBytes = 160

    /// `path` for a message: its first `shownBytes` bytes (`String.clipped(toBytes:)`) and its size.
    static func shown(_ path: String) -> String {
        let clipped = path.clipped(toBytes: shownBytes)
        return clipped.cut ? clipped.text + " (\(path.utf8.count) bytes)" : path
    }

    /// A root a client offers is taken only as one absolute local path the OS could open:
    /// otherwise it is refused, named (bounded), with why; never resolved against some directory.
    static func check(clientRoot root: String) throws(WispError) {
        // By bytes: to `String.hasPrefix` a "/" followed by a combining mark is no "/".
        let bytes = root.utf8
        let why = bytes.first != UInt8(ascii: "/") ? "it does not start with \"/\""
            : bytes.contains(0) ? "it holds a NUL byte"
            : bytes.count > maxPathBytes ? "it is \(bytes.count) bytes, over the system's \(maxPathBytes)" : nil
        guard let why else { return }
        throw WispError(.invalidArgument,
                "client root \(shown(root).debugDescription) is not an absolute local path (\(why)); fix that " +
                "root in the client, or start wisp with --root instead")
    }

    // MARK: the confined open

    /// A file or directory opened by `open(_:)`. Everything read from it goes through `fd`,
    /// the descriptor that was checked, never through its name again.
    public final class Opened {
        public let fd: Int32
        /// Its canonical path when it was opened.
        public let real: FSPath
        public let isDirectory: Bool

        init(fd: Int32, real: FSPath, isDirectory: Bool) {
            self.fd = fd
            self.real = real
            self.isDirectory = isDirectory
        }

        deinit { close(fd) }

        /// Up to `limit` bytes, and whether that was the whole file. A cancelled call stops
        /// reading (the result then says not complete).
        public func read(upTo limit: Int) -> ([UInt8], Bool) {
            var data = [UInt8]()
            var chunk = [UInt8](repeating: 0, count: 64 * 1024)
            while data.count <= limit {
                if Task.isCancelled { return (data, false) }
                let n = chunk.withUnsafeMutableBytes { systemRead(fd, $0.baseAddress!, $0.count) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return (data, true) }
                data.append(contentsOf: chunk[0..<n])
            }
            return (Array(data.prefix(limit)), false)
        }

        /// The names in this directory (without . and ..), as bytes, unsorted; empty if it cannot be read.
        public func entries() -> [[UInt8]] { directoryEntries(fd) }

        /// The kind of entry `name` in this directory, without following a symlink (S_IFDIR, S_IFREG, …).
        public func kind(of name: [UInt8]) -> mode_t? {
            var s = stat()
            guard FSPath.withCString(name, { fstatat(fd, $0, &s, AT_SYMLINK_NOFOLLOW) }) == 0 else { return nil }
            return s.st_mode & S_IFMT
        }
    }

    /// Opens `path` (relative paths from the first root) if it is a regular file or a directory
    /// inside a root, or refuses it with a message the caller can act on. No symlink is trusted
    /// by name: each component is opened from its parent's descriptor with O_NOFOLLOW, a symlink
    /// is read and its target walked the same way, and nothing outside the roots but the roots'
    /// own ancestors is ever opened (devices, FIFOs and sockets are refused before any open).
    /// Linear in the path: every component costs one step, bounded (`maxPathBytes`,
    /// `maxComponents`), and a cancelled call (cancel or time limit) stops the walk.
    public func open(_ path: String) throws(WispError) -> Opened {
        let shown = Self.shown(path)
        let walk = Walk()
        var todo: [ArraySlice<UInt8>] = []
        try walk.start(try joined(path, shown: shown), roots: self, todo: &todo, shown: shown)
        var symlinks = 0
        var steps = 0
        while let name = todo.popLast() {
            steps += 1
            guard steps <= Self.maxComponents else {
                throw WispError(.invalidArgument,
                        "\(shown): over \(Self.maxComponents) path components to walk (counting its symlinks' " +
                        "targets); give a shorter path")
            }
            if Task.isCancelled { throw WispError.callCancelled }
            if name.elementsEqual(Self.dotDot) { try walk.up(roots: self, shown: shown); continue }
            if let opened = try step(name, walk: walk, todo: &todo, symlinks: &symlinks, shown: shown) { return opened }
        }
        guard walk.inside else { throw outside(shown) }
        return walk.takeTop()
    }

    /// `path` as an absolute path (a relative one from the first root), if it can name anything.
    private func joined(_ path: String, shown: String) throws(WispError) -> FSPath {
        guard let first = directories.first else {
            throw WispError(.invalidArgument, "no readable roots are configured (start wisp with --root DIR)")
        }
        let given = FSPath(path)
        guard !given.bytes.contains(0) else { throw WispError(.invalidArgument, "path contains a NUL byte") }
        guard !given.bytes.isEmpty else { throw WispError(.invalidArgument, "path is empty") }
        guard given.bytes.count <= Self.maxPathBytes else {
            throw WispError(.invalidArgument,
                    "\(shown): the path is \(given.bytes.count) bytes, over this system's limit of " +
                    "\(Self.maxPathBytes) (PATH_MAX); give a shorter path")
        }
        return given.isAbsolute ? given : first.appending(given.bytes)
    }

    /// One step of `open`'s walk: component `name` of the walk's directory. A symlink queues its
    /// target's components, a directory is entered; the file it ends at is returned; nil goes on.
    private func step(_ name: ArraySlice<UInt8>, walk: Walk, todo: inout [ArraySlice<UInt8>], symlinks: inout Int,
                      shown: String) throws(WispError) -> Opened? {
        // "." and empty components are never queued, so nothing after this one means last.
        let isLast = todo.isEmpty
        let next = walk.path.appending(name)
        // Below a directory inside a root is inside; below one outside, only a root itself is.
        let inside = walk.inside || directories.contains(next)
        let towardARoot = !inside && directories.contains { $0.isBelow(next) }
        var s = stat()
        guard FSPath.withCString(name, { fstatat(walk.fd, $0, &s, AT_SYMLINK_NOFOLLOW) }) == 0 else {
            // Outside the roots, even whether a name exists is not the caller's to learn.
            guard inside || towardARoot else { throw outside(shown) }
            throw Self.failure(shown, errno)
        }
        switch s.st_mode & S_IFMT {
        case S_IFLNK:
            try follow(name, walk: walk, todo: &todo, symlinks: &symlinks, shown: shown)
        case S_IFDIR:
            guard inside || (towardARoot && !isLast) else { throw outside(shown) }
            let fd = FSPath.withCString(name) {
                openat(walk.fd, $0, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            }
            guard fd >= 0 else {
                // Swapped for a symlink since the fstatat: look again (bounded like any symlink).
                if errno == ELOOP || errno == ENOTDIR, symlinks < Self.maxSymlinks {
                    symlinks += 1; todo.append(name); return nil
                }
                throw Self.failure(shown, errno)
            }
            walk.push(fd, next, inside: inside)
        case S_IFREG:
            guard inside else { throw outside(shown) }
            guard isLast else {
                throw WispError(.invalidArgument,
                        "\(shown): \(Self.shown(String(decoding: name, as: UTF8.self))) is a file, not a directory")
            }
            let fd = FSPath.withCString(name) {
                openat(walk.fd, $0, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)
            }
            guard fd >= 0 else {
                if errno == ELOOP, symlinks < Self.maxSymlinks { symlinks += 1; todo.append(name); return nil }
                throw Self.failure(shown, errno)
            }
            let opened = Opened(fd: fd, real: next, isDirectory: false)
            try checkRegular(opened, shown: shown)
            return opened
        default:
            guard inside else { throw outside(shown) }
            throw WispError(.invalidArgument, "\(shown) is not a regular file (device, FIFO or socket); refused")
        }
        return nil
    }

    /// Queues the target of symlink `name` in the walk's directory in its place: an absolute one
    /// walked from the top again, a relative one from here.
    private func follow(_ name: ArraySlice<UInt8>, walk: Walk, todo: inout [ArraySlice<UInt8>], symlinks: inout Int,
                        shown: String) throws(WispError) {
        symlinks += 1
        guard symlinks <= Self.maxSymlinks else {
            throw WispError(.invalidArgument,
                            "\(shown): no such file or directory (too many levels of symbolic links)")
        }
        guard let target = Self.readLink(walk.fd, name) else { throw Self.failure(shown, errno) }
        if target.isAbsolute {
            try walk.start(target, roots: self, todo: &todo, shown: shown)
        } else {
            Self.queue(target.components, on: &todo)
        }
    }

    private static let dot: [UInt8] = [UInt8(ascii: ".")]
    private static let dotDot: [UInt8] = [UInt8(ascii: "."), UInt8(ascii: ".")]

    /// Puts components on the walk's stack (next one last), leaving out "." (empties are already out).
    fileprivate static func queue(_ components: [ArraySlice<UInt8>], on todo: inout [ArraySlice<UInt8>]) {
        for c in components.reversed() where !c.elementsEqual(dot) { todo.append(c) }
    }

    /// Opens entry `name` of `dir` (a directory this walk already holds) if it is a directory or
    /// a readable regular file; symlinks are not followed (a walk could leave the roots or loop).
    func openChild(_ dir: Opened, _ name: [UInt8]) throws(WispError) -> Opened? {
        let real = dir.real.appending(name)
        switch dir.kind(of: name) {
        case S_IFDIR?:
            let fd = FSPath.withCString(name) {
                openat(dir.fd, $0, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            }
            return fd >= 0 ? Opened(fd: fd, real: real, isDirectory: true) : nil
        case S_IFREG?:
            let fd = FSPath.withCString(name) { openat(dir.fd, $0, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC) }
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
            throw WispError(.invalidArgument, Self.hardLinkRefusal(shown, links: Int(clamping: f.st_nlink)))
        }
    }

    static func hardLinkRefusal(_ shown: String, links: Int) -> String {
        "\(shown) has \(links) hard links, so it may be a file from outside the readable roots; refused (start wisp " +
        "with --allow-hardlinks, or WISP_ALLOW_HARDLINKS=1, to read hard-linked files)"
    }

    /// Roots named in an error: a few, each short (a client may offer hundreds).
    private var listed: String {
        let few = directories.prefix(4).map { Self.shown($0.description) }.joined(separator: ", ")
        return directories.count > 4 ? few + " and \(directories.count - 4) more" : few
    }

    private func outside(_ shown: String) -> WispError {
        WispError(.invalidArgument, "\(shown): outside the readable roots (\(listed))")
    }

    private static func failure(_ shown: String, _ code: Int32) -> WispError {
        switch code {
        case ENOENT, ENOTDIR: WispError(.invalidArgument, "\(shown): no such file or directory")
        case EACCES, EPERM: WispError(.invalidArgument, "\(shown): permission denied")
        default: WispError(.invalidArgument, "\(shown): cannot open (\(String(cString: strerror(code))))")
        }
    }

    private static func readLink(_ dir: Int32, _ name: ArraySlice<UInt8>) -> FSPath? {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = buffer.withUnsafeMutableBufferPointer { b in
            b.baseAddress!.withMemoryRebound(to: CChar.self, capacity: b.count) { out in
                FSPath.withCString(name) { readlinkat(dir, $0, out, b.count - 1) }
            }
        }
        guard n > 0 else { return nil }
        return FSPath(bytes: buffer[0..<n])
    }

    /// The directories a walk holds open, innermost last, each with whether it is inside a
    /// root; `..` steps back through them rather than through the file system.
    private final class Walk {
        private var stack: [(fd: Int32, path: FSPath, inside: Bool)] = []

        deinit { for entry in stack { close(entry.fd) } }

        var fd: Int32 { stack[stack.count - 1].fd }
        var path: FSPath { stack[stack.count - 1].path }
        var inside: Bool { stack[stack.count - 1].inside }

        /// Starts (or restarts, at an absolute symlink) from the deepest root the absolute path
        /// `absolute` names literally (byte for byte), else from "/"; its other components go onto `todo`.
        func start(_ absolute: FSPath, roots: Roots, todo: inout [ArraySlice<UInt8>], shown: String) throws(WispError) {
            let components = absolute.components
            var base = FSPath.root
            var used = 0
            for root in roots.directories {
                let r = root.components
                if r.count >= used, components.count >= r.count,
                   zip(components, r).allSatisfy({ $0.elementsEqual($1) }) {
                    base = root
                    used = r.count
                }
            }
            try reset(to: base, roots: roots, shown: shown)
            Roots.queue(Array(components.dropFirst(used)), on: &todo)
        }

        /// `..`: the parent held below, or, above the first directory held (a root or "/",
        /// canonical, so its parent is its lexical parent), that parent opened by path.
        func up(roots: Roots, shown: String) throws(WispError) {
            if stack.count > 1 {
                close(stack.removeLast().fd)
            } else if path != .root {
                try reset(to: path.parent, roots: roots, shown: shown)
            }
        }

        func push(_ fd: Int32, _ path: FSPath, inside: Bool) { stack.append((fd, path, inside)) }

        /// The innermost directory, handed over to the caller.
        func takeTop() -> Opened {
            let top = stack.removeLast()
            return Opened(fd: top.fd, real: top.path, isDirectory: true)
        }

        private func reset(to directory: FSPath, roots: Roots, shown: String) throws(WispError) {
            for entry in stack { close(entry.fd) }
            stack.removeAll()
            let fd = directory.withCString { systemOpen($0, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
            guard fd >= 0 else {
                throw WispError(.invalidArgument,
                        "\(shown): cannot open \(Roots.shown(directory.description)) " +
                        "(\(String(cString: strerror(errno))))")
            }
            stack.append((fd, directory, roots.contains(directory)))
        }
    }

    static func realPath(_ path: FSPath) -> FSPath? {
        guard let p = path.withCString({ realpath($0, nil) }) else { return nil }
        defer { free(p) }
        return FSPath(bytes: UnsafeRawBufferPointer(start: p, count: strlen(p)))
    }

    static func isDirectory(_ path: FSPath) -> Bool {
        var s = stat()
        return path.withCString { stat($0, &s) } == 0 && (s.st_mode & S_IFMT) == S_IFDIR
    }
}

// The libc calls under names that members called open/read cannot shadow.
private func systemOpen(_ path: UnsafePointer<CChar>, _ flags: Int32) -> Int32 { open(path, flags) }
private func systemRead(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> Int { read(fd, buffer, count) }
