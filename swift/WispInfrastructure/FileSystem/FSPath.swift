#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A file-system path as the bytes the OS takes and gives (the UTF-8 it was given, never
/// normalised), compared, hashed, prefixed and sorted as bytes. Swift's `String` `==`,
/// `hasPrefix`, `split`, `Set` and `Dictionary` work on canonical equivalence and grapheme
/// clusters: to them `café` (NFC) and `cafe\u{301}` (NFD), two directories to Linux, are one
/// name, and a `/` followed by a combining mark is not a separator. So no file-system name is
/// ever compared as a `String`; a `String` is made from one only to show it.
public struct FSPath: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let bytes: [UInt8]

    public init(bytes: some Sequence<UInt8>) { self.bytes = Array(bytes) }
    /// The path a caller wrote: its UTF-8, as it came.
    public init(_ string: String) { bytes = Array(string.utf8) }

    public static let slash = UInt8(ascii: "/")
    public static let root = FSPath(bytes: [slash])

    /// For messages and the model: invalid UTF-8 shows as U+FFFD (never used to open anything).
    public var description: String { String(decoding: bytes, as: UTF8.self) }
    public var isAbsolute: Bool { bytes.first == Self.slash }

    public static func < (a: FSPath, b: FSPath) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }

    /// This path is `directory` or lies below it, component by component.
    public func isWithin(_ directory: FSPath) -> Bool {
        if directory.bytes == [Self.slash] { return isAbsolute }
        guard bytes.count >= directory.bytes.count, bytes.starts(with: directory.bytes) else { return false }
        return bytes.count == directory.bytes.count || bytes[directory.bytes.count] == Self.slash
    }

    /// This path lies strictly below `directory`.
    public func isBelow(_ directory: FSPath) -> Bool { bytes.count > directory.bytes.count && isWithin(directory) }

    public func appending(_ name: some Collection<UInt8>) -> FSPath {
        var b = bytes
        b.reserveCapacity(b.count + name.count + 1)
        if b != [Self.slash] { b.append(Self.slash) }
        b.append(contentsOf: name)
        return FSPath(bytes: b)
    }

    /// The lexical parent ("/" for "/"): the real parent of a canonical path.
    public var parent: FSPath {
        guard let i = bytes.lastIndex(of: Self.slash), i > 0 else { return .root }
        return FSPath(bytes: bytes[..<i])
    }

    /// The non-empty components between `/` bytes.
    public var components: [ArraySlice<UInt8>] { bytes.split(separator: Self.slash, omittingEmptySubsequences: true) }

    public func withCString<R>(_ body: (UnsafePointer<CChar>) throws -> R) rethrows -> R {
        try Self.withCString(bytes, body)
    }

    /// `name` (bytes without a NUL) as the C string a syscall takes.
    public static func withCString<R>(_ name: some Collection<UInt8>,
                                      _ body: (UnsafePointer<CChar>) throws -> R) rethrows -> R {
        var c = [UInt8](name)
        c.append(0)
        return try c.withUnsafeBufferPointer { b in
            try b.withMemoryRebound(to: CChar.self) { try body($0.baseAddress!) }
        }
    }
}

/// The names in the directory open at `fd` (without . and ..), as the bytes readdir gave,
/// unsorted; empty if it cannot be read. The descriptor stays open and is not moved.
public func directoryEntries(_ fd: Int32) -> [[UInt8]] {
    // fdopendir takes over the descriptor it is given: hand it a copy, rewound.
    let copy = dup(fd)
    guard copy >= 0 else { return [] }
    guard let dir = fdopendir(copy) else { close(copy); return [] }
    defer { closedir(dir) }
    rewinddir(dir)
    var names: [[UInt8]] = []
    while let entry = readdir(dir) {
        // d_name is a fixed-size C array on both systems (256 bytes on Linux, 1024 on macOS).
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in Array(raw.prefix { $0 != 0 }) }
        if name != [0x2E] && name != [0x2E, 0x2E] { names.append(name) }
    }
    return names
}
