import Dispatch
#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The one writer of the core's stderr: a bounded queue of lines and a thread of its own that
/// writes them with blocking writes. When stderr is not read (a client that never drains the
/// pipe it gave wisp), the queue fills and further lines are dropped and counted; once the
/// writes go through again, a line says how many were lost.
///
/// Why a thread and not O_NONBLOCK on fd 2: the flag belongs to the open file description,
/// which the core shares with the shim, the llama-server and usually the client's terminal or
/// log pipe. Setting it would make their blocking writes fail with EAGAIN, and it would stay set
/// after the core exits. A thread keeps the blocking to itself.
public final class LogSink: Sendable {
    public static let shared = LogSink(fd: 2)

    /// Queued bytes at most, by default: ample for any burst a healthy stderr drains, small beside the core.
    static let maxQueuedBytes = 256 * 1024
    /// A longer line is cut: one huge message must not take the whole queue.
    static let maxLineBytes = 8 * 1024

    private let fd: Int32
    private let capacity: Int

    private struct State {
        var lines: [[UInt8]] = []
        var bytes = 0
        var dropped = 0
        /// Lines taken by the writer and not yet written.
        var writing = 0
    }

    private let state = Locked(State())
    private let wake = DispatchSemaphore(value: 0)

    init(fd: Int32, capacity: Int = maxQueuedBytes) {
        self.fd = fd
        self.capacity = capacity
        OSThread.detach { [self] in run() }
    }

    public func post(_ text: String) {
        var line = Array(text.utf8)
        if line.count > Self.maxLineBytes {
            line.removeSubrange(Self.maxLineBytes...)
            line.append(contentsOf: Array(" …(cut)".utf8))
        }
        line.append(0x0A)
        let queued = state.withLock { s -> Bool in
            var need = line.count
            let notice = s.dropped > 0 ? Self.droppedNotice(s.dropped) : nil
            need += notice?.count ?? 0
            guard s.bytes + need <= capacity else {
                s.dropped += 1
                return false
            }
            if let notice {
                s.lines.append(notice)
                s.dropped = 0
            }
            s.lines.append(line)
            s.bytes += need
            return true
        }
        if queued { wake.signal() }
    }

    /// True when every line queued was written in time.
    @discardableResult
    public func flush(within: Duration) -> Bool {
        let end = ContinuousClock.now.advanced(by: within)
        while ContinuousClock.now < end {
            if state.withLock({ $0.lines.isEmpty && $0.writing == 0 }) { return true }
            OSThread.sleep(seconds: 0.005)
        }
        return false
    }

    private static func droppedNotice(_ n: Int) -> [UInt8] {
        Array("wisp-core warning: \(n) log line(s) dropped: stderr was not being read\n".utf8)
    }

    private func run() {
        while true {
            wake.wait()
            let batch = state.withLock { s -> [[UInt8]] in
                let taken = s.lines
                s.lines = []
                s.bytes = 0
                s.writing = taken.count
                return taken
            }
            for line in batch { writeAll(line) }
            state.withLock { $0.writing = 0 }
        }
    }

    private func writeAll(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                if n > 0 {
                    offset += n
                } else if !(n < 0 && errno == EINTR) {
                    return  // stderr closed or broken: nobody can read the line
                }
            }
        }
    }
}
