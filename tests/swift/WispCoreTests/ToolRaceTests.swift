import Foundation
import Synchronization
import Testing
@testable import WispCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A process inside the root that swaps a directory for a symlink out of it, again and again,
/// while the tools read through that directory: no read may ever return the outside file.
// Inside ModelTools, whose tests run one at a time: these are CPU-heavy, and the searches
// there have a time limit.
extension ModelTools {
    @Suite struct SymlinkSwapRace {
        static let rounds = 3_000

        @Test func swappingADirectoryForAnOutsideSymlinkNeverLeaks() async throws {
            let base = NSTemporaryDirectory() + "wisp-race-" + UUID().uuidString
            let root = base + "/root"
            let outside = base + "/outside"
            let fm = FileManager.default
            try fm.createDirectory(atPath: root + "/d", withIntermediateDirectories: true)
            try fm.createDirectory(atPath: outside, withIntermediateDirectories: true)
            defer { try? fm.removeItem(atPath: base) }
            try "harmless\n".write(toFile: root + "/d/secret.txt", atomically: false, encoding: .utf8)
            try "SECRET from outside\n".write(toFile: outside + "/secret.txt", atomically: false, encoding: .utf8)

            let stop = Atomic<Bool>(false)
            let swaps = Atomic<Int>(0)
            let swapper = Thread { [root, outside] in
                // One atomic exchange per swap, so that `d` is always there: a real directory half
                // the time, the symlink out the other half.
                let d = root + "/d", link = root + "/d.link"
                symlink(outside, link)
                while !stop.load(ordering: .relaxed) {
                    exchange(d, link)
                    swaps.add(1, ordering: .relaxed)
                }
            }
            swapper.start()
            defer { stop.store(true, ordering: .relaxed) }

            // The reads run on an OS thread of their own, as the swapper does: the tools are blocking
            // code, and on a 2-core machine the other suites need the cooperative pool meanwhile.
            let roots = Roots([root])
            let clock = ContinuousClock()
            let start = clock.now
            let (leaks, answered) = await withCheckedContinuation { (done: CheckedContinuation<((read: Int, search: Int), (read: Int, search: Int)), Never>) in
                Thread {
                    var leaks = (read: 0, search: 0)
                    var answered = (read: 0, search: 0)
                    let limits = ToolCatalogue.Limits()
                    for i in 0..<Self.rounds {
                        if let out = try? ToolCatalogue.readFile(roots: roots, path: "d/secret.txt", start: nil, end: nil, limits: limits) {
                            answered.read += 1
                            if out.contains("SECRET") { leaks.read += 1 }
                        }
                        let path = i.isMultiple(of: 2) ? "d" : "."
                        if let out = try? ToolCatalogue.searchText(roots: roots, pattern: "e", path: path, regex: false, limits: limits) {
                            answered.search += 1
                            if out.contains("SECRET") { leaks.search += 1 }
                        }
                    }
                    done.resume(returning: (leaks, answered))
                }.start()
            }
            stop.store(true, ordering: .relaxed)
            let elapsed = clock.now - start
            print("symlink swap race: \(swaps.load(ordering: .relaxed)) swaps; read_file leaked \(leaks.read) of \(Self.rounds) (\(answered.read) answered), search_text leaked \(leaks.search) of \(Self.rounds) (\(answered.search) answered), in \(elapsed)")
            #expect(leaks.read == 0 && leaks.search == 0)
            // The race must really have been run: the swapper ran, and reads got through between swaps.
            #expect(swaps.load(ordering: .relaxed) > 100)
            #expect(answered.read > 100 && answered.search > 100)
        }
    }
}

/// Swaps two names in one step (both stay present throughout).
func exchange(_ a: String, _ b: String) {
    #if canImport(Glibc)
    // glibc declares renameat2 only under _GNU_SOURCE, which Swift's import does not set.
    typealias RenameAt2 = @convention(c) (Int32, UnsafePointer<CChar>, Int32, UnsafePointer<CChar>, UInt32) -> Int32
    let renameExchange: UInt32 = 1 << 1
    guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "renameat2") else { return }
    _ = unsafeBitCast(symbol, to: RenameAt2.self)(AT_FDCWD, a, AT_FDCWD, b, renameExchange)
    #elseif canImport(Darwin)
    _ = renamex_np(a, b, UInt32(RENAME_SWAP))
    #endif
}
