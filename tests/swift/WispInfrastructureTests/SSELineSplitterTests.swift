// The SSE line splitter (HTTP/SSELineSplitter.swift): lines come out whole whatever the split,
// a multi-byte character across chunks included.
import Foundation
import Testing
@testable import WispInfrastructure

@Suite struct SSELineSplitterTests {
    @Test func sseLinesSurviveAnySplit() {
        let stream = Data("data: {\"a\":\"é\"}\r\n\r\ndata: [DONE]\n\n".utf8)
        for cut in 1..<stream.count {
            var splitter = SSELineSplitter()
            let lines = splitter.push(stream.prefix(cut)) + splitter.push(stream.dropFirst(cut)) + splitter.finish()
            #expect(lines == ["data: {\"a\":\"é\"}", "", "data: [DONE]", ""], "cut at \(cut)")
        }
    }
}
