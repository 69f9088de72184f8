#if os(Linux)
import Testing
@testable import WispInfrastructure

/// libpq is loaded at run time: a system without it is told what to install, and nothing else
/// needs it.
@Suite struct LibPQTests {
    @Test func aMissingLibraryNamesWhatToInstall() {
        guard case .failure(let e) = LibPQ.load("libwisp-no-such-pq.so.5") else {
            Issue.record("a library that does not exist was loaded")
            return
        }
        #expect(e.message.contains("libwisp-no-such-pq.so.5") && e.message.contains("apt-get install libpq5"))
        #expect(e.message.contains("--state-dir") && e.connectionLost)
    }
}
#endif
