// The pipe's operations (Pipe/Operations/): the one list, `PipeOperations.all`, gives the
// reader's op map, the facts' `operations` and the dispatch; each operation reads back from its
// own table, is answered once under its id, and tags its result with its own op.
import Foundation
import Testing
import WispInfrastructure
@testable import WispCore

@Suite struct PipeOperationList {
    /// An operation's `blank` request as its table writes it, under request id `id`.
    static func frame(_ type: any PipeOperation.Type, id: Int) -> [UInt8] {
        let text = String(decoding: Frame.encode(type.blank).dropFirst(4), as: UTF8.self)
        return Array(text.replacingOccurrences(of: #""id":0"#, with: #""id":\#(id)"#).utf8)
    }

    @Test func theNamesAreUniqueAndTheFactsStateThemInDeclaredOrder() {
        let names = PipeOperations.all.map { $0.op }
        #expect(Set(names).count == names.count, "\(names)")
        #expect(CoreFacts.json["operations"] == .array(names.map { .string($0) }))
        #expect(names == ["respond", "close_thread", "cancel", "status", "read_thread", "ping"],
                "the order is the declared order; a new operation goes at the end")
    }

    @Test func everyOperationIsReadBackFromItsOwnTable() throws {
        for (k, operation) in PipeOperations.all.enumerated() {
            let request = try PipeJSON.request(Self.frame(operation, id: k + 1))
            #expect(ObjectIdentifier(type(of: request.operation)) == ObjectIdentifier(operation), "\(operation.op)")
            #expect(request.id == k + 1, "\(operation.op)")
        }
    }

    @Test func anUnknownOpIsRefusedNamingEveryOperation() {
        let error = #expect(throws: JSONError.self) { try PipeJSON.request(Array(#"{"op":"nope","id":1}"#.utf8)) }
        #expect(error?.description.contains(
            "unknown op 'nope' (respond, close_thread, cancel, status, read_thread or ping)") == true,
                "\(String(describing: error))")
    }

    @Test func anOkResultIsTaggedByItsOperationsOp() {
        func tag<O: PipeOperation>(_: O.Type) -> String? {
            let text = String(decoding: Frame.encode(Reply.success(1, O.Result.blank)).dropFirst(4), as: UTF8.self)
            return (Wire.object(text)["result"] as? [String: Any])?["op"] as? String
        }
        for type in PipeOperations.all { #expect(tag(type) == type.op) }
    }

    @Test func theServerAnswersEveryOperationOnceUnderItsID() async throws {
        let (server, wire) = pipeServer(EchoBackend())
        for (k, type) in PipeOperations.all.enumerated() {
            await server.handle(try PipeJSON.request(Self.frame(type, id: k + 1)).operation)
        }
        for (k, type) in PipeOperations.all.enumerated() {
            let (ok, body) = await wire.reply(k + 1)
            if ok { #expect(body["op"] as? String == type.op, "\(type.op)") }
        }
        // Ping, status and a cancel of nothing answer ok; the blank respond, read_thread and
        // close_thread (no prompt, no thread id) are refused.
        let oks = await PipeOperations.all.indices.asyncMap { await wire.reply($0 + 1).ok }
        #expect(oks == [false, false, true, true, false, true])
        let replies = wire.all.map(Wire.object).filter { $0["event"] as? String == "reply" }.compactMap { $0["id"] as? Int }
        #expect(replies.sorted() == Array(1...PipeOperations.all.count), "one reply per request")
    }
}

extension Collection {
    fileprivate func asyncMap<T>(_ transform: (Element) async -> T) async -> [T] {
        var out: [T] = []
        for element in self { out.append(await transform(element)) }
        return out
    }
}
