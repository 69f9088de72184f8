// The core's log: lines are queued and written by a thread of their own, so a stderr nobody
// reads never holds up the caller; what does not fit is dropped, and counted once it drains.
import Foundation
import Testing
@testable import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

@Suite struct LogTests {
    /// A pipe whose read end does not block, as a test's stand-in for stderr.
    private struct Pipe {
        let read: Int32, write: Int32

        init() {
            var fds: [Int32] = [0, 0]
            precondition(pipe(&fds) == 0)
            (read, write) = (fds[0], fds[1])
            _ = fcntl(read, F_SETFL, fcntl(read, F_GETFL) | O_NONBLOCK)
        }

        /// Reads what the pipe holds until `done` says so of everything read (or 10 s pass).
        func drain(into text: inout [UInt8], until done: (String) -> Bool) {
            var buffer = [UInt8](repeating: 0, count: 65536)
            let end = ContinuousClock.now + .seconds(10)
            while !done(String(decoding: text, as: UTF8.self)), ContinuousClock.now < end {
                let n = buffer.withUnsafeMutableBytes { readBytes(self.read, $0.baseAddress!, $0.count) }
                if n > 0 { text.append(contentsOf: buffer[0..<n]) } else { Thread.sleep(forTimeInterval: 0.01) }
            }
        }
    }

    @Test(.timeLimit(.minutes(1))) func aPipeNobodyReadsDropsLinesAndTheCountFollowsOnceItDrains() {
        let pipe = Pipe()
        let sink = LogSink(fd: pipe.write, capacity: 4096)
        // Nobody reads: the pipe's buffer and then the queue fill, and the rest is dropped.
        // A post that waited on the pipe would never return.
        let posted = 5_000
        for i in 0..<posted { sink.post("line \(i) " + String(repeating: "x", count: 80)) }
        var out: [UInt8] = []
        pipe.drain(into: &out) { _ in sink.flush(within: .milliseconds(1)) }
        pipe.drain(into: &out) { _ in true }
        sink.post("after")
        pipe.drain(into: &out) { $0.hasSuffix("after\n") }
        let lines = String(decoding: out, as: UTF8.self).split(separator: "\n")
        let written = lines.filter { $0.hasPrefix("line ") }.count
        #expect(written > 0 && written < posted)
        // Each run of drops is noted before the next line that got through (the writer may have
        // made some progress while the lines were posted), and the notes count every line lost.
        let notes = lines.filter { $0.hasPrefix("wisp-core warning: ") && $0.hasSuffix(" log line(s) dropped: stderr was not being read") }
        let counts = notes.compactMap { Int($0.split(separator: " ")[2]) }
        #expect(counts.count == notes.count && !counts.isEmpty && counts.allSatisfy { $0 > 0 })
        #expect(counts.reduce(0, +) == posted - written, "\(notes), \(written) written")
        // A note is written just before the next line that got through: one posted late (when the
        // writer was slow to fill the pipe, a late post may find room), or else "after".
        #expect(lines.last == "after")
        for (i, line) in lines.enumerated() where notes.contains(line) {
            #expect(i + 1 < lines.count && !notes.contains(lines[i + 1]), "a note with no line after it: \(line)")
        }
    }

    @Test func aLongLineIsCut() {
        let pipe = Pipe()
        let sink = LogSink(fd: pipe.write)
        sink.post(String(repeating: "y", count: 50_000))
        var out: [UInt8] = []
        pipe.drain(into: &out) { $0.hasSuffix("\n") }
        #expect(out.count <= LogSink.maxLineBytes + 16)
        #expect(String(decoding: out, as: UTF8.self).hasSuffix("y …(cut)\n"))
    }
}

private func readBytes(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> Int { read(fd, buffer, count) }
