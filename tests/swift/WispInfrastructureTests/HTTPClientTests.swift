// wisp's own HTTP client, its pure parts: the request as bytes, an answer read from any split
// of its bytes, every length the peer states refused past its range (never a trap), who a TLS
// certificate must be for, and OpenSSL's absence said with what to install. The exchange over
// real sockets and TLS is tests/python/test_https.py's and test_openai_backend.py's.
import Foundation
import Testing
@testable import WispInfrastructure

/// A peer scripted as the pieces its bytes arrive in; what the client sends is kept.
final class ScriptedChannel: ByteChannel {
    private var pieces: [[UInt8]]
    var sent: [UInt8] = []

    init(_ pieces: [[UInt8]]) { self.pieces = pieces }
    convenience init(_ text: String, cut: Int? = nil) {
        let bytes = Array(text.utf8)
        guard let cut, cut < bytes.count else { self.init([bytes]); return }
        self.init([Array(bytes[..<cut]), Array(bytes[cut...])])
    }

    func receive(_ buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        guard !pieces.isEmpty else { return 0 }
        let n = min(buffer.count, pieces[0].count)
        pieces[0].withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: n) }
        pieces[0].removeFirst(n)
        if pieces[0].isEmpty { pieces.removeFirst() }
        return n
    }

    func sendAll(_ bytes: [UInt8]) throws { sent += bytes }
}

/// The head and the whole body of `text` read as an answer, or the error that stopped it.
func read(_ channel: ScriptedChannel) -> Result<(Int, String), HTTPError> {
    var reader = ResponseReader(channel)
    var body = Data()
    do {
        let (head, framing) = try reader.head()
        try reader.body(framing) { body.append($0) }
        return .success((head.status, String(decoding: body, as: UTF8.self)))
    } catch {
        return .failure(error as! HTTPError)
    }
}

func kind(_ result: Result<(Int, String), HTTPError>) -> HTTPError.Kind? {
    if case .failure(let e) = result { e.kind } else { nil }
}

@Suite struct HTTPClientTests {
    @Test func answersReadTheSameWhateverTheSplit() {
        let answers = [
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 200, "hello"),
            ("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok", 201, "ok"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\nA\r\n0123456789\r\n0\r\n\r\n",
             200, "abc0123456789"),
            ("HTTP/1.0 404 Not Found\n\nno length: to the close", 404, "no length: to the close"),
        ]
        for (text, status, body) in answers {
            for cut in 1...text.utf8.count {
                let got = read(ScriptedChannel(text, cut: cut))
                guard case .success(let (s, b)) = got else { Issue.record("\(got) at \(cut)"); continue }
                #expect(s == status && b == body, "cut at \(cut) of \(text.debugDescription)")
            }
        }
    }

    @Test func everyStatedLengthIsTakenOnlyInRange() {
        let refused = [
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 99 OK\r\n\r\n",
            "HTTP/1.1 +20 OK\r\n\r\n",
            "SMTP 220 hello\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffffff\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nabcde\r\n0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n",
            "HTTP/1.1 200 OK\r\nX-Long: " + String(repeating: "a", count: 70_000) + "\r\n\r\n",
        ]
        for text in refused {
            #expect(kind(read(ScriptedChannel(text))) == .malformedResponse, "\(text.prefix(80).debugDescription)")
        }
    }

    @Test func anAnswerCutShortSaysWhere() {
        let cut = read(ScriptedChannel("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"))
        guard case .failure(let e) = cut else { Issue.record("read \(cut)"); return }
        #expect(e.kind == .connectionLost && e.detail.contains("3 bytes into its Content-Length of 10 bytes"))
        #expect(kind(read(ScriptedChannel("HTTP/1.1 200 OK\r\nContent-Le"))) == .connectionLost)
        #expect(kind(read(ScriptedChannel("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")))
                == .connectionLost)
    }

    @Test func theRequestIsWrittenOnceWithItsLength() throws {
        let url = URL(string: "https://[::1]:8443/v1/chat/completions?x=1")!
        let target = try HTTPTarget(url)
        #expect(target.secure && target.host == "::1" && target.port == 8443)
        #expect(target.path == "/v1/chat/completions?x=1")
        let request = HTTPRequest(method: "POST", url: url,
                                  headers: [("Accept", "text/event-stream"), ("Content-Length", "999")],
                                  body: Data("{}".utf8), idleTimeout: 5)
        let text = String(decoding: try RequestHead.encode(request, to: target), as: UTF8.self)
        #expect(text == "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: [::1]:8443\r\nConnection: close\r\n"
                + "Accept: text/event-stream\r\nContent-Length: 2\r\n\r\n{}")
        var injected = request
        injected.headers = [("Authorization", "Bearer k\r\nX-Evil: 1")]
        #expect(throws: HTTPError.self) { try RequestHead.encode(injected, to: target) }
    }

    @Test func targetsTakeTheSchemesPortAndRefuseTheRest() throws {
        #expect(try HTTPTarget(URL(string: "https://example.com")!).port == 443)
        let plain = try HTTPTarget(URL(string: "http://example.com")!)
        #expect(!plain.secure && plain.host == "example.com" && plain.port == 80 && plain.path == "/")
        for bad in ["ftp://example.com/", "http:///v1", "http://example.com:70000/", "file:///etc/passwd"] {
            guard let url = URL(string: bad) else { continue }
            #expect(throws: HTTPError.self, "\(bad)") { try HTTPTarget(url) }
        }
    }

    #if os(Linux)
    @Test func certificatesAreForAnAddressOrAName() {
        #expect(TLSPeer(host: "127.0.0.1") == .address([127, 0, 0, 1]))
        #expect(TLSPeer(host: "::1") == .address(Array(repeating: 0, count: 15) + [1]))
        #expect(TLSPeer(host: "localhost") == .name("localhost"))
        #expect(TLSPeer(host: "1.2.3") == .name("1.2.3"))  // not an address inet_pton takes: a name
    }

    @Test func noOpenSSLSaysWhatToInstall() {
        guard case .failure(let e) = OpenSSL.load("libwisp-no-such-ssl.so.3", "libwisp-no-such-crypto.so.3") else {
            Issue.record("a library that does not exist loaded")
            return
        }
        #expect(e.kind == .tlsUnavailable)
        #expect(e.detail.contains("libwisp-no-such-ssl.so.3") && e.detail.contains("apt-get install libssl3"))
        #expect(e.detail.contains("plain http works without it"))
    }

    // Present is asked of the loader alone: a second `OpenSSL.load` here would make a second
    // SSL_CTX that nothing frees (the AddressSanitizer run reports it as a leak).
    @Test(.enabled(if: librariesPresent(OpenSSL.libraries.ssl, OpenSSL.libraries.crypto),
                   "the system has no OpenSSL 3 (libssl3) to load"))
    func theSystemsOpenSSLLoads() {
        #expect(HTTPClient.tlsProblem == nil)
    }
    #endif
}

#if os(Linux)
private func librariesPresent(_ names: String...) -> Bool {
    names.allSatisfy { name in
        guard let handle = dlopen(name, RTLD_NOW | RTLD_LOCAL) else { return false }
        dlclose(handle)
        return true
    }
}
#endif
