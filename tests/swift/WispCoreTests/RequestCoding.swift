// A request as Foundation's JSONEncoder writes it and JSONDecoder reads it: the independent
// reading PipeJSONTests and the fuzz target (make fuzz compiles this file into it) compare the
// core's reader with. Test code only: the core reads requests through their field tables.
import Foundation
#if canImport(WispCore)
@testable import WispCore
#endif

/// `Request` through `Codable`: `op`, then the operation's own synthesized fields, for every
/// operation in `PipeOperations.all` (none named here).
struct CodedRequest: Codable, Equatable {
    var request: Request

    init(_ request: Request) { self.request = request }

    private enum Keys: String, CodingKey { case op }

    init(from decoder: any Decoder) throws {
        let keys = try decoder.container(keyedBy: Keys.self)
        let op = try keys.decode(String.self, forKey: .op)
        guard let type = PipeOperations.all.first(where: { $0.op == op }) as? any (PipeOperation & Decodable).Type else {
            throw DecodingError.dataCorruptedError(forKey: .op, in: keys, debugDescription: "unknown op \(op)")
        }
        request = Request(try type.init(from: decoder))
    }

    func encode(to encoder: any Encoder) throws {
        var keys = encoder.container(keyedBy: Keys.self)
        try keys.encode(type(of: request.operation).op, forKey: .op)
        try request.operation.encode(to: encoder)
    }
}

extension JSONDecoder {
    /// The request in `data` as JSONDecoder reads it.
    func request(from data: Data) throws -> Request { try decode(CodedRequest.self, from: data).request }
}

extension JSONEncoder {
    func encode(_ request: Request) throws -> Data { try encode(CodedRequest(request)) }
}
