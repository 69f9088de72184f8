import Foundation
import WispInfrastructure

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
/// - A file (format 2) is an append-only log of JSON lines: a header line
///   `{"format":2,"id":…,"written":T,"instructions":…,"tools":[…],"roots":[…]}` (the binding; T is
///   Unix seconds), then one record per turn of the history, oldest first, each two lines: the
///   turn `{"prompt":…,"toolExchanges":[…],"response":…,"tokens":N}` (`Turn.write`; a turn's
///   `reasoning`, where its model returned one, is an optional field) and its commit
///   `{"turns":K,"written":T}` (K: the turns stored up to it; `list_threads` reads only this last line).
/// - A committed turn appends its record and `fdatasync`s the file, one sync, when the file is
///   the one this process last wrote or read and ends with the commit of the turn before. Any
///   other write replaces the whole file atomically: a temporary file in the same directory,
///   written, fsynced, renamed over the old one, then the directory fsynced. That is the first
///   store of a thread, a turn that condensed (dropped turns), turns that were kept in memory
///   only, and a file of format 1 or with a torn record. A crash at any instant leaves the old
///   or the new state.
/// - A torn last record (its writer killed, or the machine stopped, mid-append: at most two lines
///   that are cut short or do not read) is not part of the thread: the file holds the turns
///   before it. Anything else (garbage, a record that does not read with more after it, another
///   format, over `maxFileBytes`, a directory or symlink in its place, a header for another id, a
///   commit that miscounts) is corrupt: moved aside to `thread-<id>.json.corrupt-<unix time>-<random>`,
///   that call fails naming the file, and the id starts afresh on the next call.
/// - Format 1, two lines (a header `{"format":1,"id":…,"turns":N,"written":T}` and the state
///   `{"instructions":…,"tools":[…],"roots":[…],"history":[turn…]}`), is still read; the thread's
///   next write replaces it in format 2.
/// - Several processes may share a directory. A call holds `flock` on `thread-<id>.lock` for its
///   whole run (another process waits up to `lockWait`, then gets `busy`), and reloads the file
///   first when its identity (device, inode, size, mtime) is not what this process last wrote or
///   read: every write renames a new inode into place or appends (the size grows), so a change
///   is always seen. A lock file is
///   unlinked only by its holder, and a taker checks the path still names the inode it locked.
/// - At most `maxStored` thread files; writing a new one deletes the least recently written
///   (by the `written` of its last commit or header) that no process holds.
///   A lock file lives only while its thread is stored or a call holds it: a call that leaves
///   no stored file removes its lock, and start-up sweeps orphans (of processes that died).
/// - A lock file that is not a regular file (a symlink, a directory, a FIFO in its place) is
///   moved aside like a corrupt thread file: that call fails saying so, the next one works.
/// - A directory that fails under a running wisp (remounted read-only, removed, full, I/O
///   errors) is set aside, not fatal: calls are served in memory and say so (`trouble`, the
///   reply's `store_error`), and the directory is tried again every `retryInterval`.
/// - Every operation here may block on the file system: callers run them off the pipe's
///   thread (`lock` hops off itself).
public final class ThreadStore: Sendable {
    /// The format written; format 1 is read too.
    public static let format = 2
    /// Over this, a file is corrupt: the pipe's frame limit bounds what one turn may add, and no
    /// thread a model's context can hold comes near it.
    public static let maxFileBytes = 64 * 1024 * 1024
    public static let lockWait = Duration.seconds(2)

    public let directory: String
    public let maxStored: Int
    private let log: Log
    private let hooks: Hooks
    /// Why the directory is not in use now, and when to try it again (nil: in use).
    private let health = Locked<(trouble: String, retryAt: ContinuousClock.Instant)?>(nil)
    /// Threads closed while the directory could not be written: their files are not read (a
    /// closed thread must not come back) and are deleted once it can be.
    private let closedMeanwhile = Locked<Set<String>>([])
    /// How long a failed directory is left alone before it is tried again.
    public static let retryInterval = Duration.seconds(5)

    /// A fault-injection seam for tests: a slow or hung file system, simulated.
    public struct Hooks: Sendable {
        /// Runs (where the store's blocking work runs) before each attempt to take a thread's lock.
        public var beforeLock: @Sendable (_ id: String) -> Void
        public init(beforeLock: @escaping @Sendable (_ id: String) -> Void = { _ in }) { self.beforeLock = beforeLock }
    }

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

    /// A file's first line. Format 2 holds the binding here; format 1 the turns of its state line.
    struct Header: Codable {
        var format: Int
        var id: String
        var turns: Int?
        /// When it was written (Unix seconds): the order for the cap, finer than a file's mtime,
        /// which the kernel keeps to a clock tick (several writes may share one).
        var written: Double?
        var instructions: String?
        var tools: [String]?
        var roots: [String]?
    }

    /// The line that makes a turn's record whole: the turns stored up to it, and when.
    struct Commit: Codable {
        var turns: Int
        var written: Double
    }

    /// A file's identity: which write of it this is.
    public struct Stamp: Sendable, Equatable {
        let dev: UInt64, ino: UInt64, size: Int64, sec: Int, nsec: Int
    }

    /// A thread's lock, held while its file descriptor is open.
    public final class Lock: Sendable {
        fileprivate let fd: Int32
        fileprivate let id: String
        fileprivate init(fd: Int32, id: String) { self.fd = fd; self.id = id }
        deinit { close(fd) }
    }

    /// Opens (creating if needed) the state directory and checks it can be written.
    public init(directory: String, maxStored: Int, log: Log, hooks: Hooks = Hooks()) throws(WispError) {
        let dir = Self.absolute(directory)
        self.directory = dir
        self.maxStored = max(1, maxStored)
        self.log = log
        self.hooks = hooks
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
        if let why = Self.probe(dir) { throw Self.unusable(dir, why) }
        removeStaleTemporaries()
        sweepOrphanLocks()
    }

    /// Nil when a file can be written in `dir`, else why not.
    private static func probe(_ dir: String) -> String? {
        let probe = dir + "/.probe-\(getpid())"
        let fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return "cannot write in it: \(errorText())" }
        let wrote = write(fd, "x", 1)
        let e = errno
        close(fd)
        unlink(probe)
        return wrote == 1 ? nil : "cannot write in it: \(errorText(e))"
    }

    // MARK: a directory that fails later

    /// Why the directory is not in use now (it failed under this running wisp); nil while it is.
    public var trouble: String? { health.withLock { $0?.trouble } }

    /// What a call served in memory because of `trouble` says in its reply.
    public func inMemoryNote(_ trouble: String) -> String {
        "state dir \(directory) is not usable now (\(trouble)); this turn is kept in memory only, and wisp tries the directory again every \(Self.retryInterval.components.seconds) s"
    }

    /// Sets the directory aside after `why` (said once in the log), to be tried again later.
    private func failed(_ why: String) {
        let first = health.withLock { h -> Bool in
            defer { h = (why, ContinuousClock.now + Self.retryInterval) }
            return h == nil
        }
        if first { log(.error, "state dir \(directory) failed: \(why); threads are served in memory until it works again (tried every \(Self.retryInterval))") }
    }

    /// Whether the directory may be used now: true while in use, and when a retry that is due
    /// finds it writable again.
    private func usable() -> Bool {
        let due = health.withLock { h -> Bool? in
            guard let h else { return nil }
            return ContinuousClock.now >= h.retryAt
        }
        guard let due else { return true }
        guard due else { return false }
        let dir = directory
        var st = stat()
        let why: String? = lstat(dir, &st) != 0 ? "cannot inspect it: \(Self.errorText())"
            : (st.st_mode & S_IFMT) != S_IFDIR ? "it is no longer a directory" : Self.probe(dir)
        if let why {
            failed(why)
            return false
        }
        health.withLock { $0 = nil }
        log(.info, "state dir \(directory) is usable again: threads are stored again from their next turn")
        for id in closedMeanwhile.withLock({ $0 }) {
            guard let lock = try? tryLock(id) else { continue }
            delete(id, holding: lock)
            _ = closedMeanwhile.withLock { $0.remove(id) }
        }
        return true
    }

    /// `path` made absolute against the working directory, its bytes otherwise as given: no
    /// lexical `..` folding (wrong past a symlink) and no Unicode normalisation (Foundation's
    /// URL paths may apply one), so the directory opened is the one named.
    static func absolute(_ path: String) -> String {
        if path.utf8.first == UInt8(ascii: "/") { return path }
        return FileManager.default.currentDirectoryPath + "/" + path
    }

    /// The names in the state directory, as bytes (empty if it cannot be read).
    private func names() -> [[UInt8]] {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return [] }
        defer { close(fd) }
        return directoryEntries(fd)
    }

    /// The id in a file name `prefix<id>suffix`, matched by bytes, if it is a valid id.
    private static func id(in name: [UInt8], prefix: String, suffix: String) -> String? {
        let p = Array(prefix.utf8), q = Array(suffix.utf8)
        guard name.count > p.count + q.count, name.starts(with: p), name.reversed().starts(with: q.reversed()) else { return nil }
        let id = String(decoding: name[p.count..<(name.count - q.count)], as: UTF8.self)
        return ThreadRegistry.isValidID(id) ? id : nil
    }

    private static func unusable(_ dir: String, _ why: String) -> WispError {
        WispError(.internal, "state dir \(dir) is not usable: \(why). Threads are kept in memory only until it is fixed and wisp restarted.")
    }

    private static func errorText(_ code: Int32 = errno) -> String { String(cString: strerror(code)) }

    func path(_ id: String) -> String { directory + "/thread-\(id).json" }
    private func lockPath(_ id: String) -> String { directory + "/thread-\(id).lock" }

    // MARK: locks

    /// Takes the thread's lock, waiting up to `lockWait` for another holder to let go; nil when
    /// the directory is not usable now (`trouble` says why: serve the call in memory). Off the
    /// pipe's thread: a hung mount blocks the open and the flock.
    public func lock(_ id: String) async throws(WispError) -> Lock? {
        try await offPipeLoop { () async throws(WispError) -> Lock? in
            let deadline = ContinuousClock.now.advanced(by: Self.lockWait)
            while true {
                guard self.usable() else { return nil }
                switch try self.take(id) {
                case .taken(let lock): return lock
                case .unusable: return nil
                case .held: break
                }
                if Task.isCancelled { throw WispError.cancelledWhileWaiting }
                guard ContinuousClock.now < deadline else {
                    throw WispError(.busy, "thread '\(id)' is in use by another call or another wisp process sharing state dir \(self.directory) (its lock \(self.lockPath(id)) was held for \(Self.lockWait)); try again when that call has finished, or use another thread")
                }
                try? await Task.sleep(for: .milliseconds(5))
            }
        }
    }

    /// `lock`, then (with `load`) what `loadIfChanged(id, seen:)` finds, in one trip off the
    /// pipe's thread. Without the lock (the directory failed) a read that fails is taken for
    /// `.unchanged`: the call goes on in memory. A failed read under the lock lets it go first.
    public func lockAndLoad(_ id: String, seen: Stamp?, load: Bool) async throws(WispError) -> (Lock?, Found) {
        try await offPipeLoop { () async throws(WispError) -> (Lock?, Found) in
            let lock = try await self.lock(id)
            guard load else { return (lock, .unchanged) }
            do throws(WispError) {
                return (lock, try self.loadIfChanged(id, seen: seen))
            } catch {
                guard let lock else { return (nil, .unchanged) }
                self.release(lock)
                throw error
            }
        }
    }

    /// The thread's lock if no one holds it now, else nil (also when the directory failed).
    public func tryLock(_ id: String) throws(WispError) -> Lock? {
        if case .taken(let lock) = try take(id) { return lock }
        return nil
    }

    private enum Take { case taken(Lock), held, unusable }

    private func take(_ id: String) throws(WispError) -> Take {
        let path = lockPath(id)
        while true {
            hooks.beforeLock(id)
            // O_NONBLOCK: a FIFO in the lock's place must not block the open.
            let fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0o600)
            guard fd >= 0 else {
                let e = errno
                if e == EINTR { continue }
                // Not a file we can lock (ELOOP: a symlink; EISDIR: a directory; ENXIO: a socket).
                if e == ELOOP || e == EISDIR || e == ENXIO { throw badLock(id, Self.errorText(e)) }
                failed("cannot open the lock file \(path): \(Self.errorText(e))")
                return .unusable
            }
            var held = stat()
            guard fstat(fd, &held) == 0, (held.st_mode & S_IFMT) == S_IFREG else {
                close(fd)
                throw badLock(id, "it is not a regular file")
            }
            if flock(fd, LOCK_EX | LOCK_NB) != 0 {
                let e = errno
                close(fd)
                if e == EWOULDBLOCK || e == EINTR { return .held }
                failed("cannot lock \(path): \(Self.errorText(e))")
                return .unusable
            }
            // Its holder may have unlinked it before we locked it: then the lock guards nothing.
            var now = stat()
            if lstat(path, &now) == 0, held.st_dev == now.st_dev, held.st_ino == now.st_ino {
                return .taken(Lock(fd: fd, id: id))
            }
            close(fd)
        }
    }

    /// A lock file that is not one: moved aside (never deleted: someone may want to look), and
    /// the call that found it is told; the next call takes a fresh lock.
    private func badLock(_ id: String, _ why: String) -> WispError {
        let path = lockPath(id)
        var st = stat()
        // Only what is still not a regular file is moved: a racing process may have replaced it
        // with a real lock file already, which must not be moved from under its holder.
        let stillBad = lstat(path, &st) == 0 && (st.st_mode & S_IFMT) != S_IFREG
        let aside = path + ".corrupt-\(Int(Date().timeIntervalSince1970))-\(UInt32.random(in: 0...UInt32.max))"
        let fate = !stillBad ? "it has been replaced since" : rename(path, aside) == 0 ? "it was moved aside to \(aside)" : "moving it aside failed (\(Self.errorText())); remove it by hand"
        log(.error, "thread '\(id)': lock file \(path) is unusable (\(why)); \(fate)")
        return WispError(.internal, "thread '\(id)' could not be locked: its lock file \(path) is not a lock file (\(why)); \(fate). The thread is unchanged: call respond again.")
    }

    /// Lets go of a thread's lock, removing the lock file when the thread is not stored (so
    /// ids whose calls never commit leave nothing behind). Blocking: call it off the pipe's thread.
    public func release(_ lock: Lock) {
        var st = stat()
        guard lstat(path(lock.id), &st) != 0 && errno == ENOENT else { return }
        // Only while the path still names the inode held: once a delete has unlinked it, the
        // name may be another holder's new lock file (only a holder unlinks its own).
        var held = stat(), now = stat()
        let lockFile = lockPath(lock.id)
        if fstat(lock.fd, &held) == 0, lstat(lockFile, &now) == 0, held.st_dev == now.st_dev, held.st_ino == now.st_ino {
            unlink(lockFile)
        }
    }

    /// Lock files whose thread is not stored, left by processes that died holding them.
    private func sweepOrphanLocks() {
        let all = names()
        let stored = Set(all.compactMap { Self.id(in: $0, prefix: "thread-", suffix: ".json") })
        for id in all.compactMap({ Self.id(in: $0, prefix: "thread-", suffix: ".lock") }) where !stored.contains(id) {
            guard let lock = try? tryLock(id) else { continue }
            release(lock)
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

    /// What `loadIfChanged` found.
    public enum Found: Sendable {
        /// The file is the one last seen.
        case unchanged
        /// No file is stored (closed, deleted over the cap, or never stored).
        case none
        case loaded(State, Stamp)
    }

    /// The thread's stored state if its file is not the one `seen` (what this process last
    /// wrote or read). Blocking: call it off the pipe's thread.
    public func loadIfChanged(_ id: String, seen: Stamp?) throws(WispError) -> Found {
        if closedMeanwhile.withLock({ $0.contains(id) }) { return .none }
        guard stamp(id) != seen else { return .unchanged }
        guard let (state, stamp) = try load(id) else { return .none }
        return .loaded(state, stamp)
    }

    /// The thread's stored state, nil when none is stored. A corrupt file is moved aside and
    /// the error names it.
    public func load(_ id: String) throws(WispError) -> (State, Stamp)? {
        let file = path(id)
        // Opened first, then checked by its descriptor: a FIFO swapped in after a look by name
        // would block a plain open for good; O_NONBLOCK opens it at once, and fstat refuses it.
        let fd = open(file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let e = errno
            if e == ENOENT { return nil }
            if e == ELOOP { throw corrupt(id, "it is a symbolic link") }
            if e == ENXIO { throw corrupt(id, "it is not a regular file") }
            throw WispError(.internal, "could not read stored thread '\(id)' (\(file)): \(Self.errorText(e))")
        }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw WispError(.internal, "could not read stored thread '\(id)' (\(file)): \(Self.errorText())") }
        guard (st.st_mode & S_IFMT) == S_IFREG else { throw corrupt(id, "it is not a regular file") }
        guard st.st_size <= Self.maxFileBytes else { throw corrupt(id, "it is \(st.st_size) bytes, over the \(Self.maxFileBytes)-byte limit") }
        guard let data = Self.readAll(fd, count: Int(st.st_size)) else { throw corrupt(id, "it was shorter than its size when read") }
        do throws(Unreadable) {
            let (state, _, torn) = try Self.decode(data, id: id)
            if torn { log(.info, "stored thread '\(id)': \(file) ends in a record cut short (a crash while it was written), which is not part of the thread; the thread's next turn rewrites the file") }
            return (state, Self.stamp(st))
        } catch {
            throw corrupt(id, error.why)
        }
    }

    /// `count` bytes from the start of `fd`; nil when it has fewer.
    private static func readAll(_ fd: Int32, count: Int) -> [UInt8]? {
        var data = [UInt8](repeating: 0, count: count)
        var got = 0
        while got < data.count {
            let n = data.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + got, $0.count - got, off_t(got)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            got += n
        }
        return got == data.count ? data : nil
    }

    /// Why a file's bytes are not a thread.
    struct Unreadable: Error { let why: String }

    /// A file's bytes (either format) as the thread `id`'s state, and when its last whole record
    /// (or its header) was written. A torn last record is left out (`torn`).
    static func decode(_ data: [UInt8], id: String) throws(Unreadable) -> (state: State, written: Double?, torn: Bool) {
        guard let newline = data.firstIndex(of: 0x0A) else { throw Unreadable(why: "it has no header line") }
        let header: Header
        do { header = try Header.read(data[..<newline]) } catch { throw Unreadable(why: "its header is not valid JSON (\(error))") }
        guard header.format == 1 || header.format == Self.format else {
            throw Unreadable(why: "it is in format \(header.format), this wisp reads formats 1 and \(Self.format)")
        }
        guard header.id == id else { throw Unreadable(why: "its header names thread '\(header.id)'") }
        if header.format == 1 {
            guard let turns = header.turns else { throw Unreadable(why: "its header is not valid JSON (field 'turns' is missing)") }
            let state: State
            do { state = try State.read(data[(newline + 1)...]) } catch { throw Unreadable(why: "its state is not valid JSON (truncated?)") }
            guard state.history.count == turns else { throw Unreadable(why: "its header says \(turns) turns, its history holds \(state.history.count)") }
            return (state, header.written, false)
        }
        guard let tools = header.tools, let roots = header.roots else { throw Unreadable(why: "its header lacks the thread's tools or roots") }
        var history: [Turn] = []
        var written = header.written
        var at = newline + 1
        while at < data.count {
            if let (turn, commit, next) = Self.record(data, at: at) {
                guard commit.turns == history.count + 1 else {
                    throw Unreadable(why: "its record of turn \(history.count + 1) says \(commit.turns) turns")
                }
                history.append(turn)
                written = commit.written
                at = next
                continue
            }
            // Not whole: the torn last record when no more than its own two lines follow.
            var lines = 0
            for byte in data[at...] where byte == 0x0A { lines += 1; if lines > 2 { break } }
            guard lines <= 2 else { throw Unreadable(why: "its record of turn \(history.count + 1) is not valid JSON, and more follows it") }
            return (State(instructions: header.instructions, tools: tools, roots: roots, history: history), written, true)
        }
        return (State(instructions: header.instructions, tools: tools, roots: roots, history: history), written, false)
    }

    /// The record (turn line, commit line) at `at`, and where the next one starts; nil when
    /// there is none whole there.
    private static func record(_ data: [UInt8], at: Int) -> (Turn, Commit, next: Int)? {
        guard let end = data[at...].firstIndex(of: 0x0A), let close = data[(end + 1)...].firstIndex(of: 0x0A),
              let turn = try? readWhole(data[at..<end], { r throws(JSONError) in try Turn.read(&r) }),
              let commit = try? Commit.read(data[(end + 1)..<close]) else { return nil }
        return (turn, commit, close + 1)
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

    /// Stores a thread's state; the caller holds its lock. `appendingTo`: the identity of the file
    /// as the caller last wrote or read it, when that file holds this state but its last turn
    /// (no turn dropped, none kept in memory only since): the turn is appended, if the file is
    /// still that one and ends with the commit of the turn before. Otherwise the whole file is
    /// replaced. Returns the new file's identity.
    public func save(_ id: String, _ state: State, appendingTo seen: Stamp? = nil) throws(WispError) -> Stamp {
        if let seen, let last = state.history.last, let appended = try append(id, last, turns: state.history.count, to: seen) {
            return appended
        }
        return try replace(id, state)
    }

    /// Appends turn number `turns`'s record to the file `seen` and syncs it; nil when the file
    /// is not that one, or does not end with the commit of turn `turns - 1`.
    private func append(_ id: String, _ turn: Turn, turns: Int, to seen: Stamp) throws(WispError) -> Stamp? {
        let fd = open(path(id), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG, Self.stamp(st) == seen,
              Self.lastCommit(fd, size: Int(st.st_size))?.turns == turns - 1 else { return nil }
        var w = JSONWriter(capacity: 1024)
        Self.record(turn, turns: turns, written: Date().timeIntervalSince1970, to: &w)
        let bytes = w.bytes, end = off_t(st.st_size)
        func failed(_ what: String, _ code: Int32 = errno) -> WispError {
            // A record cut short would read as torn anyway; cut it off so the file is as it was.
            _ = ftruncate(fd, end)
            return WispError(.internal, "could not store thread '\(id)' in \(directory): \(what): \(Self.errorText(code))")
        }
        guard Self.writeAll(fd, bytes, at: end) else { throw failed("appending") }
        // The size is what makes the record readable: fdatasync syncs it with the data.
        guard Self.syncData(fd) == 0 else { throw failed("fdatasync") }
        fstat(fd, &st)
        _ = closedMeanwhile.withLock { $0.remove(id) }
        return Self.stamp(st)
    }

    /// Writes the thread's whole file atomically: a temporary file, synced, renamed into place.
    private func replace(_ id: String, _ state: State) throws(WispError) -> Stamp {
        let file = path(id)
        let bytes = Self.encode(id, state, written: Date().timeIntervalSince1970)
        let isNew = stamp(id) == nil
        let temporary = directory + "/.tmp-thread-\(id).\(getpid()).\(UInt32.random(in: 0...UInt32.max))"
        func failed(_ what: String, _ code: Int32 = errno) -> WispError {
            unlink(temporary)
            return WispError(.internal, "could not store thread '\(id)' in \(directory): \(what): \(Self.errorText(code))")
        }
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let e = errno
            // The directory itself refuses new files (read-only, removed, full): set it aside.
            self.failed("cannot create a file in it: \(Self.errorText(e))")
            throw failed("creating a temporary file", e)
        }
        guard Self.writeAll(fd, bytes, at: 0) else { let e = errno; close(fd); throw failed("writing", e) }
        guard fsync(fd) == 0 else { let e = errno; close(fd); throw failed("fsync", e) }
        var st = stat()
        fstat(fd, &st)
        close(fd)
        guard rename(temporary, file) == 0 else { throw failed("renaming into place") }
        _ = closedMeanwhile.withLock { $0.remove(id) }
        syncDirectory()
        if isNew { enforceCap(keeping: id) }
        return Self.stamp(st)
    }

    /// Writes `bytes` at `start`; false (errno says why) when the file takes fewer.
    private static func writeAll(_ fd: Int32, _ bytes: [UInt8], at start: off_t) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress! + offset, $0.count - offset, start + off_t(offset)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }
            offset += n
        }
        return true
    }

    /// A whole file in the current format.
    static func encode(_ id: String, _ state: State, written: Double) -> [UInt8] {
        // By hand (JSONWriter): a whole thread is written at once.
        var w = JSONWriter(capacity: 4096)
        Header(format: format, id: id, written: written, instructions: state.instructions, tools: state.tools, roots: state.roots).write(to: &w)
        w.byte(0x0A)
        for (i, turn) in state.history.enumerated() { record(turn, turns: i + 1, written: written, to: &w) }
        return w.bytes
    }

    /// One turn's record: the turn's line, then its commit.
    private static func record(_ turn: Turn, turns: Int, written: Double, to w: inout JSONWriter) {
        turn.write(to: &w)
        w.byte(0x0A)
        Commit(turns: turns, written: written).write(to: &w)
        w.byte(0x0A)
    }

    /// The file's last line read as a commit, when it is one (nil: a format-1 file, a torn
    /// record, a file of no turns). A commit is a few dozen bytes: the tail holds it whole.
    private static func lastCommit(_ fd: Int32, size: Int) -> Commit? {
        var tail = [UInt8](repeating: 0, count: min(size, 128))
        let n = tail.withUnsafeMutableBytes { pread(fd, $0.baseAddress!, $0.count, off_t(size - $0.count)) }
        guard n == tail.count, tail.last == 0x0A else { return nil }
        let body = tail.dropLast()
        guard let start = body.lastIndex(of: 0x0A) else { return nil }
        return try? Commit.read(body[(start + 1)...])
    }

    /// Syncs a file's data and what reading it needs (its size), not its times.
    private static func syncData(_ fd: Int32) -> Int32 {
        #if canImport(Glibc)
        return fdatasync(fd)
        #else
        return fsync(fd)
        #endif
    }

    /// Makes a rename durable: without it a crash may forget the new directory entry.
    private func syncDirectory() {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        fsync(fd)
        close(fd)
    }

    /// Deletes a thread's file; the caller holds `lock` (whose file goes too). False when the
    /// file is still there (the directory failed: read-only, say).
    @discardableResult
    public func delete(_ id: String, holding lock: Lock) -> Bool {
        let gone = unlink(path(id)) == 0 || errno == ENOENT
        unlink(lockPath(id))
        syncDirectory()
        return gone
    }

    /// Deletes a thread's file after taking its lock. True when a file was there. Nothing is
    /// deleted while the directory is not usable.
    public func delete(_ id: String) async throws(WispError) -> Bool {
        guard let lock = try await self.lock(id) else {
            // Deleted once the directory can be written; not read meanwhile.
            let stored = await offPipeLoop { self.stamp(id) != nil }
            if stored { closedMeanwhile.withLock { _ = $0.insert(id) } }
            return stored
        }
        return await offPipeLoop {
            let existed = self.stamp(id) != nil
            self.delete(id, holding: lock)
            return existed
        }
    }

    // MARK: listing and the cap

    public struct Summary: Sendable, Equatable {
        public let id: String
        public let turns: Int
        public let modified: Double
    }

    /// Every stored thread whose header reads, most recently written first.
    public func summaries() -> [Summary] {
        var out: [Summary] = []
        for name in names() {
            guard let id = Self.id(in: name, prefix: "thread-", suffix: ".json"), !closedMeanwhile.withLock({ $0.contains(id) }) else { continue }
            var st = stat()
            guard lstat(path(id), &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { continue }
            let s = Self.stamp(st)
            let h = summary(id)
            out.append(Summary(id: id, turns: h?.turns ?? 0, modified: h?.written ?? Double(s.sec) + Double(s.nsec) / 1e9))
        }
        return out.sorted { $0.modified > $1.modified }
    }

    /// A stored thread's turns and when it was last written, read cheaply: a format-2 file's
    /// last commit, a format-1 file's header; a file that has neither (no turns, a torn record)
    /// is read whole.
    private func summary(_ id: String) -> (turns: Int, written: Double?)? {
        let fd = open(path(id), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG, st.st_size <= Self.maxFileBytes else { return nil }
        let size = Int(st.st_size)
        if let commit = Self.lastCommit(fd, size: size) { return (commit.turns, commit.written) }
        var buffer = [UInt8](repeating: 0, count: min(size, 512))
        let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress!, $0.count, 0) }
        if n > 0, let newline = buffer[..<n].firstIndex(of: 0x0A), let header = try? Header.read(buffer[..<newline]),
           header.format == 1, let turns = header.turns {
            return (turns, header.written)
        }
        guard let data = Self.readAll(fd, count: size), let (state, written, _) = try? Self.decode(data, id: id) else { return nil }
        return (state.history.count, written)
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
        for name in names() where name.starts(with: ".tmp-thread-".utf8) {
            let parts = name.split(separator: UInt8(ascii: "."))
            guard parts.count >= 3, let pid = Int32(String(decoding: parts[parts.count - 2], as: UTF8.self)) else { continue }
            if kill(pid, 0) != 0 && errno == ESRCH { FSPath(directory).appending(name).withCString { _ = unlink($0) } }
        }
    }
}

extension ThreadStore.Header: JSONWritable {
    func write(to w: inout JSONWriter) {
        w.object {
            $0.field("format", format); $0.field("id", id); $0.field("turns", turns); $0.field("written", written)
            $0.field("instructions", instructions)
            if let tools { $0.field("tools", tools) }
            if let roots { $0.field("roots", roots) }
        }
    }
}

extension ThreadStore.Commit: JSONWritable {
    func write(to w: inout JSONWriter) {
        w.object { $0.field("turns", turns); $0.field("written", written) }
    }
}

extension Turn: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("prompt", prompt); $0.field("toolExchanges", toolExchanges); $0.field("response", response)
            $0.field("tokens", tokens); $0.field("reasoning", reasoning); $0.field("structured", structured)
        }
    }
}

extension ToolExchange: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("name", name); $0.field("arguments", arguments); $0.field("output", output); $0.field("failed", failed) }
    }
}

// MARK: reading (the core's one JSON reader, WispInfrastructure/JSON/JSON.swift)

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
    private struct Fields { var format: Int?, id: String?, turns: Int?, written: Double?, instructions: String?, tools: [String]?, roots: [String]? }
    private static let table = JSONFields<Fields>([
        "format": { r, f throws(JSONError) in f.format = try r.int() },
        "id": { r, f throws(JSONError) in f.id = try r.string() },
        "turns": { r, f throws(JSONError) in f.turns = try r.int() },
        "written": { r, f throws(JSONError) in f.written = try r.nullable { r throws(JSONError) in try r.double() } },
        "instructions": { r, f throws(JSONError) in f.instructions = try r.nullable { r throws(JSONError) in try r.string() } },
        "tools": { r, f throws(JSONError) in f.tools = try r.strings() },
        "roots": { r, f throws(JSONError) in f.roots = try r.strings() },
    ])

    static func read(_ bytes: ArraySlice<UInt8>) throws(JSONError) -> Self {
        try readWhole(bytes) { r throws(JSONError) in
            var f = Fields()
            try r.object(into: &f, table)
            return Self(format: try required(f.format, "format"), id: try required(f.id, "id"), turns: f.turns, written: f.written,
                        instructions: f.instructions, tools: f.tools, roots: f.roots)
        }
    }
}

extension ThreadStore.Commit {
    private struct Fields { var turns: Int?, written: Double? }
    private static let table = JSONFields<Fields>([
        "turns": { r, f throws(JSONError) in f.turns = try r.int() },
        "written": { r, f throws(JSONError) in f.written = try r.double() },
    ])

    static func read(_ bytes: ArraySlice<UInt8>) throws(JSONError) -> Self {
        try readWhole(bytes) { r throws(JSONError) in
            var f = Fields()
            try r.object(into: &f, table)
            return Self(turns: try required(f.turns, "turns"), written: try required(f.written, "written"))
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
    private struct Fields {
        var prompt: String?, toolExchanges: [ToolExchange]?, response: String?, tokens: Int?, reasoning: String?, structured: Bool?
    }
    private static let table = JSONFields<Fields>([
        "prompt": { r, f throws(JSONError) in f.prompt = try r.string() },
        "toolExchanges": { r, f throws(JSONError) in f.toolExchanges = try r.array { r throws(JSONError) in try ToolExchange.read(&r) } },
        "response": { r, f throws(JSONError) in f.response = try r.string() },
        "tokens": { r, f throws(JSONError) in f.tokens = try r.int() },
        "reasoning": { r, f throws(JSONError) in f.reasoning = try r.nullable { r throws(JSONError) in try r.string() } },
        "structured": { r, f throws(JSONError) in f.structured = try r.bool() },
    ])

    static func read(_ r: inout JSONReader) throws(JSONError) -> Turn {
        var f = Fields()
        try r.object(into: &f, table)
        return Turn(prompt: try required(f.prompt, "prompt"), toolExchanges: try required(f.toolExchanges, "toolExchanges"),
                    response: try required(f.response, "response"), reasoning: f.reasoning, tokens: try required(f.tokens, "tokens"),
                    structured: f.structured ?? false)
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
