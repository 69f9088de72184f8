import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Durable threads (`--state-dir`): the on-disk format and every file operation on it.
///
/// - One file per thread, `thread-<id>.json` (ids `.` and `..` are valid ids, hence the prefix),
///   mode 0600, in a directory of mode 0700 created if missing; an existing directory that is
///   not ours or is group/world-writable is refused (someone else could plant or swap files).
/// - A file is two lines of JSON: a header `{"format":1,"id":…,"turns":N,"written":T}` (read alone by
///   `list_threads`) and the state: binding (instructions, tool names, client roots) and the
///   canonical history. Anything else (garbage, truncated, another format, over `maxFileBytes`,
///   a directory or symlink in its place, a header that disagrees with its body) is corrupt:
///   moved aside to `thread-<id>.json.corrupt-<unix time>-<random>`, that call fails naming the file,
///   and the id starts afresh on the next call.
/// - A write is atomic: a temporary file in the same directory, written, fsynced, renamed over
///   the old one, then the directory fsynced. A crash at any instant leaves the old or the new state.
/// - Several processes may share a directory. A call holds `flock` on `thread-<id>.lock` for its
///   whole run (another process waits up to `lockWait`, then gets `busy`), and reloads the file
///   first when its identity (device, inode, size, mtime) is not what this process last wrote or
///   read: every write renames a new inode into place, so a change is always seen. A lock file is
///   unlinked only by its holder, and a taker checks the path still names the inode it locked.
/// - At most `maxStored` thread files; writing a new one deletes the least recently written
///   (every committed turn rewrites its file, stamping the header) that no process holds.
public final class ThreadStore: Sendable {
    public static let format = 1
    /// Over this, a file is corrupt: the pipe's frame limit bounds what one turn may add, and no
    /// thread a model's context can hold comes near it.
    public static let maxFileBytes = 64 * 1024 * 1024
    public static let lockWait = Duration.seconds(2)

    public let directory: String
    public let maxStored: Int
    private let log: Log

    /// What a thread file holds besides its header.
    public struct State: Codable, Sendable, Equatable {
        public var instructions: String?
        public var tools: [String]
        public var roots: [String]
        public var history: [Turn]
        public init(instructions: String?, tools: [String], roots: [String], history: [Turn]) {
            self.instructions = instructions
            self.tools = tools
            self.roots = roots
            self.history = history
        }
    }

    struct Header: Codable {
        var format: Int
        var id: String
        var turns: Int
        /// When it was written (Unix seconds): the order for the cap, finer than a file's mtime,
        /// which the kernel keeps to a clock tick (several writes may share one).
        var written: Double?
    }

    /// A file's identity: which write of it this is.
    public struct Stamp: Sendable, Equatable {
        let dev: UInt64, ino: UInt64, size: Int64, sec: Int, nsec: Int
    }

    /// A thread's lock, held while its file descriptor is open.
    public final class Lock: Sendable {
        fileprivate let fd: Int32
        fileprivate init(fd: Int32) { self.fd = fd }
        deinit { close(fd) }
    }

    /// Opens (creating if needed) the state directory and checks it can be written.
    public init(directory: String, maxStored: Int, log: Log) throws(WispError) {
        let dir = URL(fileURLWithPath: directory).standardizedFileURL.path
        self.directory = dir
        self.maxStored = max(1, maxStored)
        self.log = log
        var st = stat()
        if lstat(dir, &st) != 0 {
            guard errno == ENOENT else { throw Self.unusable(dir, "cannot inspect it: \(Self.errorText())") }
            do {
                try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            } catch {
                throw Self.unusable(dir, "cannot create it: \(error.localizedDescription)")
            }
            guard lstat(dir, &st) == 0 else { throw Self.unusable(dir, "cannot inspect it: \(Self.errorText())") }
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else { throw Self.unusable(dir, "it is not a directory (a symlink is not accepted either)") }
        guard st.st_uid == getuid() else { throw Self.unusable(dir, "it belongs to another user (uid \(st.st_uid))") }
        if st.st_mode & 0o022 != 0 {
            throw Self.unusable(dir, "it is writable by group or others (mode \(String(st.st_mode & 0o777, radix: 8))), so another user could swap thread files; run `chmod 700 \(dir)`")
        }
        // Read-only filesystems and full disks show here, at start, rather than on the first turn.
        let probe = dir + "/.probe-\(getpid())"
        let fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Self.unusable(dir, "cannot write in it: \(Self.errorText())") }
        let wrote = write(fd, "x", 1)
        close(fd)
        unlink(probe)
        guard wrote == 1 else { throw Self.unusable(dir, "cannot write in it: \(Self.errorText())") }
        removeStaleTemporaries()
    }

    private static func unusable(_ dir: String, _ why: String) -> WispError {
        WispError(.internal, "state dir \(dir) is not usable: \(why). Threads are kept in memory only until it is fixed and wisp restarted.")
    }

    private static func errorText(_ code: Int32 = errno) -> String { String(cString: strerror(code)) }

    func path(_ id: String) -> String { directory + "/thread-\(id).json" }
    private func lockPath(_ id: String) -> String { directory + "/thread-\(id).lock" }

    // MARK: locks

    /// Takes the thread's lock, waiting up to `lockWait` for another holder to let go.
    public func lock(_ id: String) async throws(WispError) -> Lock {
        let deadline = ContinuousClock.now.advanced(by: Self.lockWait)
        while true {
            if let lock = try tryLock(id) { return lock }
            if Task.isCancelled { throw WispError.cancelledWhileWaiting }
            guard ContinuousClock.now < deadline else {
                throw WispError(.busy, "thread '\(id)' is in use by another call or another wisp process sharing state dir \(directory) (its lock \(lockPath(id)) was held for \(Self.lockWait)); try again when that call has finished, or use another thread")
            }
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    /// The thread's lock if no one holds it now, else nil.
    public func tryLock(_ id: String) throws(WispError) -> Lock? {
        let path = lockPath(id)
        while true {
            let fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw WispError(.internal, "could not open the lock file \(path): \(Self.errorText())") }
            if flock(fd, LOCK_EX | LOCK_NB) != 0 {
                let e = errno
                close(fd)
                if e == EWOULDBLOCK || e == EINTR { return nil }
                throw WispError(.internal, "could not lock \(path): \(Self.errorText(e))")
            }
            // Its holder may have unlinked it before we locked it: then the lock guards nothing.
            var held = stat(), now = stat()
            if fstat(fd, &held) == 0, lstat(path, &now) == 0, held.st_dev == now.st_dev, held.st_ino == now.st_ino {
                return Lock(fd: fd)
            }
            close(fd)
        }
    }

    // MARK: reading

    /// The identity of the thread's file now, nil when there is none.
    public func stamp(_ id: String) -> Stamp? {
        var st = stat()
        guard lstat(path(id), &st) == 0 else { return nil }
        return Self.stamp(st)
    }

    private static func stamp(_ st: stat) -> Stamp {
        #if canImport(Darwin)
        let t = st.st_mtimespec
        #else
        let t = st.st_mtim
        #endif
        // dev_t is signed (Int32) on Darwin: its bits, not its value, identify the device.
        return Stamp(dev: UInt64(bitPattern: Int64(st.st_dev)), ino: UInt64(st.st_ino), size: Int64(st.st_size), sec: Int(t.tv_sec), nsec: Int(t.tv_nsec))
    }

    /// The thread's stored state, nil when none is stored. A corrupt file is moved aside and
    /// the error names it.
    public func load(_ id: String) throws(WispError) -> (State, Stamp)? {
        let file = path(id)
        var st = stat()
        guard lstat(file, &st) == 0 else {
            if errno == ENOENT { return nil }
            throw WispError(.internal, "could not read stored thread '\(id)' (\(file)): \(Self.errorText())")
        }
        guard (st.st_mode & S_IFMT) == S_IFREG else { throw corrupt(id, "it is not a regular file") }
        guard st.st_size <= Self.maxFileBytes else { throw corrupt(id, "it is \(st.st_size) bytes, over the \(Self.maxFileBytes)-byte limit") }
        let fd = open(file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw WispError(.internal, "could not read stored thread '\(id)' (\(file)): \(Self.errorText())") }
        defer { close(fd) }
        var data = [UInt8](repeating: 0, count: Int(st.st_size))
        var got = 0
        while got < data.count {
            let n = data.withUnsafeMutableBytes { read(fd, $0.baseAddress! + got, $0.count - got) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            got += n
        }
        guard got == data.count else { throw corrupt(id, "it was shorter than its size when read") }
        guard let newline = data.firstIndex(of: 0x0A) else { throw corrupt(id, "it has no header line") }
        let header: Header
        do { header = try Header.read(data[..<newline]) } catch { throw corrupt(id, "its header is not valid JSON (\(error))") }
        guard header.format == Self.format else { throw corrupt(id, "it is in format \(header.format), this wisp reads format \(Self.format)") }
        guard header.id == id else { throw corrupt(id, "its header names thread '\(header.id)'") }
        let state: State
        do { state = try State.read(data[(newline + 1)...]) } catch { throw corrupt(id, "its state is not valid JSON (truncated?)") }
        guard state.history.count == header.turns else { throw corrupt(id, "its header says \(header.turns) turns, its history holds \(state.history.count)") }
        return (state, Self.stamp(st))
    }

    /// Moves a bad thread file aside and says so, as the error of the call that found it.
    public func corrupt(_ id: String, _ why: String) -> WispError {
        let file = path(id)
        // Unique: a rename onto an earlier bad file would destroy it (or fail, for a directory).
        let aside = file + ".corrupt-\(Int(Date().timeIntervalSince1970))-\(UInt32.random(in: 0...UInt32.max))"
        let moved = rename(file, aside) == 0
        let fate = moved ? "it was moved aside to \(aside)" : "moving it aside failed (\(Self.errorText())); remove it by hand"
        log(.error, "stored thread '\(id)': \(file) is unreadable: \(why); \(fate)")
        return WispError(.internal, "stored thread '\(id)' could not be read: \(file) \(why.hasPrefix("it ") ? why.dropFirst(3) : Substring(why)); \(fate). Call respond again to start thread '\(id)' afresh.")
    }

    // MARK: writing

    /// Stores a thread's state atomically; the caller holds its lock. Returns the new file's identity.
    public func save(_ id: String, _ state: State) throws(WispError) -> Stamp {
        let file = path(id)
        // By hand (JSONWriter): the whole thread is written on every turn.
        var w = JSONWriter(capacity: 4096)
        Header(format: Self.format, id: id, turns: state.history.count, written: Date().timeIntervalSince1970).write(to: &w)
        w.byte(0x0A)
        state.write(to: &w)
        w.byte(0x0A)
        let bytes = w.bytes
        let isNew = stamp(id) == nil
        let temporary = directory + "/.tmp-thread-\(id).\(getpid()).\(UInt32.random(in: 0...UInt32.max))"
        func failed(_ what: String, _ code: Int32 = errno) -> WispError {
            unlink(temporary)
            return WispError(.internal, "could not store thread '\(id)' in \(directory): \(what): \(Self.errorText(code))")
        }
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failed("creating a temporary file") }
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { let e = errno; close(fd); throw failed("writing", e) }
            offset += n
        }
        guard fsync(fd) == 0 else { let e = errno; close(fd); throw failed("fsync", e) }
        var st = stat()
        fstat(fd, &st)
        close(fd)
        guard rename(temporary, file) == 0 else { throw failed("renaming into place") }
        syncDirectory()
        if isNew { enforceCap(keeping: id) }
        return Self.stamp(st)
    }

    /// Makes a rename durable: without it a crash may forget the new directory entry.
    private func syncDirectory() {
        let fd = open(directory, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        fsync(fd)
        close(fd)
    }

    /// Deletes a thread's file; the caller holds `lock` (whose file goes too).
    public func delete(_ id: String, holding lock: Lock) {
        unlink(path(id))
        unlink(lockPath(id))
        syncDirectory()
    }

    /// Deletes a thread's file after taking its lock. True when a file was there.
    public func delete(_ id: String) async throws(WispError) -> Bool {
        let lock = try await self.lock(id)
        let existed = stamp(id) != nil
        delete(id, holding: lock)
        return existed
    }

    // MARK: listing and the cap

    public struct Summary: Sendable, Equatable {
        public let id: String
        public let turns: Int
        public let modified: Double
    }

    /// Every stored thread whose header reads, most recently written first.
    public func summaries() -> [Summary] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return [] }
        var out: [Summary] = []
        for name in names where name.hasPrefix("thread-") && name.hasSuffix(".json") {
            let id = String(name.dropFirst(7).dropLast(5))
            guard ThreadRegistry.isValidID(id) else { continue }
            var st = stat()
            guard lstat(path(id), &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { continue }
            let s = Self.stamp(st)
            let h = header(id)
            out.append(Summary(id: id, turns: h?.turns ?? 0, modified: h?.written ?? Double(s.sec) + Double(s.nsec) / 1e9))
        }
        return out.sorted { $0.modified > $1.modified }
    }

    private func header(_ id: String) -> Header? {
        let fd = open(path(id), O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 512)
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
        guard n > 0, let newline = buffer[..<n].firstIndex(of: 0x0A) else { return nil }
        return try? Header.read(buffer[..<newline])
    }

    /// Deletes the least recently written threads over `maxStored`, skipping any a call holds.
    private func enforceCap(keeping id: String) {
        let all = summaries()
        guard all.count > maxStored else { return }
        var excess = all.count - maxStored
        for victim in all.reversed() where excess > 0 && victim.id != id {
            guard let lock = try? tryLock(victim.id) else { continue }
            delete(victim.id, holding: lock)
            log(.info, "stored thread '\(victim.id)' deleted: over --max-stored-threads \(maxStored), least recently used")
            excess -= 1
        }
    }

    /// Temporary files of writers that died mid-write (a process that is gone cannot finish them).
    private func removeStaleTemporaries() {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        for name in names where name.hasPrefix(".tmp-thread-") {
            let parts = name.split(separator: ".")
            guard parts.count >= 3, let pid = Int32(parts[parts.count - 2]) else { continue }
            if kill(pid, 0) != 0 && errno == ESRCH { unlink(directory + "/" + name) }
        }
    }
}

extension ThreadStore.State: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("instructions", instructions); $0.field("tools", tools); $0.field("roots", roots); $0.field("history", history) }
    }
}

extension ThreadStore.Header: JSONWritable {
    func write(to w: inout JSONWriter) {
        w.object { $0.field("format", format); $0.field("id", id); $0.field("turns", turns); $0.field("written", written) }
    }
}

extension Turn: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("prompt", prompt); $0.field("toolExchanges", toolExchanges); $0.field("response", response); $0.field("tokens", tokens) }
    }
}

extension ToolExchange: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("name", name); $0.field("arguments", arguments); $0.field("output", output); $0.field("failed", failed) }
    }
}

// MARK: reading (the core's one JSON reader, Support/JSON.swift)

/// A stored value's fields while they are read: each required one must turn up.
private func required<T>(_ value: T?, _ name: String) throws(JSONError) -> T {
    guard let value else { throw JSONError("field '\(name)' is missing", at: -1) }
    return value
}

private func readWhole<T>(_ bytes: ArraySlice<UInt8>, _ read: (inout JSONReader) throws(JSONError) -> T) throws(JSONError) -> T {
    let result: Result<T, JSONError> = bytes.withUnsafeBytes { b in
        var r = JSONReader(b)
        do throws(JSONError) {
            let value = try read(&r)
            try r.end()
            return .success(value)
        } catch {
            return .failure(error)
        }
    }
    return try result.get()
}

extension ThreadStore.Header {
    private struct Fields { var format: Int?, id: String?, turns: Int?, written: Double? }
    private static let table = JSONFields<Fields>([
        "format": { r, f throws(JSONError) in f.format = try r.int() },
        "id": { r, f throws(JSONError) in f.id = try r.string() },
        "turns": { r, f throws(JSONError) in f.turns = try r.int() },
        "written": { r, f throws(JSONError) in f.written = try r.nullable { r throws(JSONError) in try r.double() } },
    ])

    static func read(_ bytes: ArraySlice<UInt8>) throws(JSONError) -> Self {
        try readWhole(bytes) { r throws(JSONError) in
            var f = Fields()
            try r.object(into: &f, table)
            return Self(format: try required(f.format, "format"), id: try required(f.id, "id"), turns: try required(f.turns, "turns"), written: f.written)
        }
    }
}

extension ThreadStore.State {
    private struct Fields { var instructions: String?, tools: [String]?, roots: [String]?, history: [Turn]? }
    private static let table = JSONFields<Fields>([
        "instructions": { r, f throws(JSONError) in f.instructions = try r.nullable { r throws(JSONError) in try r.string() } },
        "tools": { r, f throws(JSONError) in f.tools = try r.strings() },
        "roots": { r, f throws(JSONError) in f.roots = try r.strings() },
        "history": { r, f throws(JSONError) in f.history = try r.array { r throws(JSONError) in try Turn.read(&r) } },
    ])

    static func read(_ bytes: ArraySlice<UInt8>) throws(JSONError) -> Self {
        try readWhole(bytes) { r throws(JSONError) in
            var f = Fields()
            try r.object(into: &f, table)
            return Self(instructions: f.instructions, tools: try required(f.tools, "tools"), roots: try required(f.roots, "roots"),
                        history: try required(f.history, "history"))
        }
    }
}

extension Turn {
    private struct Fields { var prompt: String?, toolExchanges: [ToolExchange]?, response: String?, tokens: Int? }
    private static let table = JSONFields<Fields>([
        "prompt": { r, f throws(JSONError) in f.prompt = try r.string() },
        "toolExchanges": { r, f throws(JSONError) in f.toolExchanges = try r.array { r throws(JSONError) in try ToolExchange.read(&r) } },
        "response": { r, f throws(JSONError) in f.response = try r.string() },
        "tokens": { r, f throws(JSONError) in f.tokens = try r.int() },
    ])

    static func read(_ r: inout JSONReader) throws(JSONError) -> Turn {
        var f = Fields()
        try r.object(into: &f, table)
        return Turn(prompt: try required(f.prompt, "prompt"), toolExchanges: try required(f.toolExchanges, "toolExchanges"),
                    response: try required(f.response, "response"), tokens: try required(f.tokens, "tokens"))
    }
}

extension ToolExchange {
    private struct Fields { var name: String?, arguments: String?, output: String?, failed: Bool? }
    private static let table = JSONFields<Fields>([
        "name": { r, f throws(JSONError) in f.name = try r.string() },
        "arguments": { r, f throws(JSONError) in f.arguments = try r.string() },
        "output": { r, f throws(JSONError) in f.output = try r.string() },
        "failed": { r, f throws(JSONError) in f.failed = try r.bool() },
    ])

    static func read(_ r: inout JSONReader) throws(JSONError) -> ToolExchange {
        var f = Fields()
        try r.object(into: &f, table)
        return ToolExchange(name: try required(f.name, "name"), arguments: try required(f.arguments, "arguments"),
                            output: try required(f.output, "output"), failed: try required(f.failed, "failed"))
    }
}
