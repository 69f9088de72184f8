import Foundation
import Testing
@testable import WispCore

/// The model server's borders that need no server: what the read check expects a request to
/// read. Against scripted servers in tests/python/test_model_server_borders.py.
@Suite struct OpenAIBorderTests {
    @Test func aTemplatesFixedTokensAreNotChargedPerByteOfTheNextTurn() {
        // SmolLM2's first request as measured: 39 tokens read of 40 bytes, most of them template.
        var check = ReadCheck()
        let first: [ChatMessage] = [.text("user", "Remember this: the secret word is mango.")]
        check.record(read: 39, messages: 1, bytes: 40)
        let next = first + [.text("assistant", "The secret word is not a word."), .text("user", "Hi.")]
        // The server read 60 of this one: the floor must stay below it.
        let floor = check.floor(next)
        #expect(floor.tokens < 60, "floor \(floor.tokens)")
        #expect(floor.tokens == Int(39 * 0.99 - 8 + 0.75 * ReadCheck.maxTokensPerByte * 33))
    }

    @Test func aCutOfAWholeTurnIsStillBelowTheFloor() {
        // Text at 4 bytes a token, as the scripted Ollama counts: the cap does not weaken the check.
        var check = ReadCheck()
        let turn = String(repeating: "abcd ", count: 40)  // 200 bytes, 50 tokens
        let sent: [ChatMessage] = [.text("user", turn), .text("assistant", turn), .text("user", turn)]
        check.record(read: 150, messages: 3, bytes: 600)
        let next = sent + [.text("assistant", turn), .text("user", turn)]
        // The oldest turn dropped: 200 of 250 tokens read.
        #expect(check.floor(next).tokens > 200)
    }

    @Test func aStreamIsWholeOnlyWithItsFinishReasonAndItsDone() {
        func check(_ lines: [String], _ finish: String?) -> String? {
            var end = StreamEnd()
            for line in lines { end.see(line) }
            do { try end.check(finish, received: 10, from: "here") } catch { return error.message }
            return nil
        }
        #expect(check(["data: {}", "data: [DONE]"], "stop") == nil)
        #expect(check(["data: {}"], "stop")?.contains("(no [DONE] after 10 bytes") == true)
        #expect(check(["data: {}"], nil)?.contains("no finish_reason and no [DONE]") == true)
        #expect(check(["data:[DONE]"], nil)?.contains("(no finish_reason after") == true)
        // A server that ignored `stream` answers one JSON body: its finish_reason is its end.
        #expect(check(["{\"choices\": []}"], "length") == nil)
        #expect(check(["{\"choices\": []}"], nil) != nil)
    }
}
