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

/// The state dir as wisp opened it at start. Checked once (ours, mode 0700, writable) and held
/// open: after start nothing is found through its path again. Files in it are reached through
/// the descriptor (or, for SQLite's own, through descriptors SQLite opened at start), and the
/// path is only compared with it, so a directory swapped for a symlink, moved or remounted over
/// is seen (`replaced`) and nothing is read or written at what the path names now.
final class StateDirectory: Sendable {
    let path: String
    private let fd: Int32
    private let dev: UInt64, ino: UInt64
    /// The file whose bytes are the leases between processes (`lockShare`): one byte per id.
    private let leaseFD: Int32
    /// This process's holds on each lease byte: two ids of one process may share a byte, and
    /// POSIX locks belong to the process, so the byte is let go only with its last holder.
    private let holds = Locked<[Int64: Int]>([:])
    static let leaseFile = "threads.leases"

    init(_ given: String) throws(WispError) {
        let dir = given.utf8.first == UInt8(ascii: "/") ? given : FileManager.default.currentDirectoryPath + "/" + given
        path = dir
        var st = stat()
        if lstat(dir, &st) != 0 {
            guard errno == ENOENT else { throw Self.unusable(dir, "cannot inspect it: \(errorText())") }
            do {
                try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o700])
            } catch {
                #if canImport(Darwin)
                // Interpolated, Foundation's NSError prints its domain, user info and addresses.
                throw Self.unusable(dir, "cannot create it: \(error.localizedDescription)")
                #else
                throw Self.unusable(dir, "cannot create it: \(error)")
                #endif
            }
        }
        let fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else {
            let e = errno
            let notDirectory = "it is not a directory (a symlink is not accepted either)"
            throw Self.unusable(dir, e == ELOOP || e == ENOTDIR ? notDirectory : "cannot open it: \(errorText(e))")
        }
        guard fstat(fd, &st) == 0 else { close(fd); throw Self.unusable(dir, "cannot inspect it: \(errorText())") }
        guard st.st_uid == getuid() else {
            close(fd)
            throw Self.unusable(dir, "it belongs to another user (uid \(st.st_uid))")
        }
        if st.st_mode & 0o022 != 0 {
            close(fd)
            let mode = String(st.st_mode & 0o777, radix: 8)
            throw Self.unusable(dir, "it is writable by group or others (mode \(mode)), "
                                + "so another user could swap its files; run `chmod 700 \(dir)`")
        }
        self.fd = fd
        (dev, ino) = Self.identity(st)
        // Read-only filesystems and full disks show here, at start, rather than on the first turn.
        leaseFD = openat(fd, Self.leaseFile, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0o600)
        guard leaseFD >= 0 else { close(fd); throw Self.unusable(dir, "cannot write in it: \(errorText())") }
    }

    deinit {
        close(leaseFD)
        close(fd)
    }

    static func unusable(_ dir: String, _ why: String) -> WispError {
        WispError(.internal, "state dir \(dir) is not usable: \(why). "
                  + "Threads are kept in memory only until it is fixed and wisp restarted.")
    }

    private static func identity(_ st: stat) -> (UInt64, UInt64) {
        // dev_t is signed (Int32) on Darwin: its bits, not its value, identify the device.
        (UInt64(bitPattern: Int64(st.st_dev)), UInt64(st.st_ino))
    }

    /// Nil while the path names the directory opened at start and it is still linked; else why not.
    func replaced() -> String? {
        var held = stat()
        guard fstat(fd, &held) == 0 else { return "it cannot be inspected: \(errorText())" }
        if held.st_nlink == 0 { return "it has been removed" }
        var now = stat()
        guard lstat(path, &now) == 0 else { return "its path names nothing now (moved or removed: \(errorText()))" }
        if (now.st_mode & S_IFMT) == S_IFLNK { return "its path is a symbolic link now, not the directory wisp opened" }
        guard Self.identity(now) == (dev, ino) else {
            return "its path names another directory now (moved, replaced or mounted over)"
        }
        return nil
    }

    /// True when the file `name` in the opened directory is the one its path names: checked once,
    /// just after SQLite opened it by that path.
    func agrees(_ name: String) -> Bool {
        var a = stat(), b = stat()
        guard fstatat(fd, name, &a, AT_SYMLINK_NOFOLLOW) == 0, (a.st_mode & S_IFMT) == S_IFREG,
              lstat(path + "/" + name, &b) == 0 else { return false }
        return Self.identity(a) == Self.identity(b) && replaced() == nil
    }

    /// Creates the file `name` (mode 0600) unless it exists: SQLite would create it with the
    /// umask's mode, and gives its WAL files the mode of the database's.
    func createPrivate(_ name: String) {
        let f = openat(fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        if f >= 0 { fchmod(f, 0o600); close(f) }
    }

    /// Renames `name` aside (never deleting it: a person may want to look) to
    /// `name.<tag>-<time>-<random>`; the new name, or why it could not be moved.
    func moveAside(_ name: String, tag: String) -> Result<String, WispError> {
        let aside = name + ".\(tag)-\(Int(Date().timeIntervalSince1970))-\(UInt32.random(in: 0...UInt32.max))"
        guard renameat(fd, name, fd, aside) == 0 else {
            let why = "moving \(path)/\(name) aside failed (\(errorText())); remove it by hand"
            return .failure(WispError(.internal, why))
        }
        return .success(path + "/" + aside)
    }

    /// The names in the directory, as bytes.
    func names() -> [[UInt8]] {
        let copy = dup(fd)
        guard copy >= 0 else { return [] }
        defer { close(copy) }
        lseek(copy, 0, SEEK_SET)
        return directoryEntries(copy)
    }

    /// The regular file `name`'s bytes, at most `limit` (nil: not a readable regular file; `tooLarge` over it).
    func read(_ name: [UInt8], limit: Int) -> (bytes: [UInt8]?, why: String?) {
        let f = FSPath.withCString(name) { openat(fd, $0, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) }
        guard f >= 0 else {
            return (nil, errno == ELOOP ? "it is a symbolic link" : "it cannot be opened: \(errorText())")
        }
        defer { close(f) }
        var st = stat()
        guard fstat(f, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { return (nil, "it is not a regular file") }
        guard st.st_size <= limit else { return (nil, "it is \(st.st_size) bytes, over the \(limit)-byte limit") }
        var data = [UInt8](repeating: 0, count: Int(st.st_size))
        var got = 0
        while got < data.count {
            let n = data.withUnsafeMutableBytes { pread(f, $0.baseAddress! + got, $0.count - got, off_t(got)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            got += n
        }
        return got == data.count ? (data, nil) : (nil, "it was shorter than its size when read")
    }

    // MARK: leases between processes

    /// Takes this process's share of `id`'s lease byte: false while another process holds it.
    /// The kernel lets go of a process's locks when it exits, however it exits.
    func lockShare(_ id: String) -> Bool {
        let at = Self.byte(id)
        return holds.withLock { holds -> Bool in
            if let n = holds[at] { holds[at] = n + 1; return true }
            guard lock(at, F_WRLCK) else { return false }
            holds[at] = 1
            return true
        }
    }

    func unlockShare(_ id: String) {
        let at = Self.byte(id)
        holds.withLock { holds in
            guard let n = holds[at] else { return }
            if n > 1 { holds[at] = n - 1; return }
            holds[at] = nil
            _ = lock(at, F_UNLCK)
        }
    }

    private func lock(_ at: Int64, _ type: Int32) -> Bool {
        var l = flock()
        l.l_type = Int16(type)
        l.l_whence = Int16(SEEK_SET)
        l.l_start = off_t(at)
        l.l_len = 1
        return fcntl(leaseFD, F_SETLK, &l) == 0
    }

    /// An id's byte: FNV-1a of its bytes, below 2^40 (two ids sharing a byte only wait for each other).
    static func byte(_ id: String) -> Int64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in id.utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        return Int64(h & ((1 << 40) - 1))
    }
}

func errorText(_ code: Int32 = errno) -> String { String(cString: strerror(code)) }
