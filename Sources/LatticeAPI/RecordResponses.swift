import LatticeCore

/// An answer a client could not read: a member missing or of the wrong type.
public struct AnswerError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The operation answered (`records/modify`).
    public let operation: String
    /// What was wrong (`records[2].recordName is missing`).
    public let detail: String

    public init(_ operation: String, _ detail: String) {
        self.operation = operation
        self.detail = detail
    }

    public var description: String { "the answer to \(operation) was not understood: \(detail)" }
}

/// Reading an answer's members with the operation's name in every error.
struct AnswerReader {
    let operation: String

    func object(_ json: JSON, _ path: String) throws(AnswerError) -> [String: JSON] {
        guard let object = json.objectValue else { throw AnswerError(operation, "\(path) must be an object") }
        return object
    }

    func array(_ json: JSON?, _ path: String) throws(AnswerError) -> [JSON] {
        guard let array = json?.arrayValue else { throw AnswerError(operation, "\(path) must be an array") }
        return array
    }

    func string(_ json: JSON?, _ path: String) throws(AnswerError) -> String {
        guard let text = json?.stringValue else { throw AnswerError(operation, "\(path) must be a string") }
        return text
    }

    /// A zone id with its owner, as answers give it.
    func zoneID(_ json: JSON?, _ path: String) throws(AnswerError) -> WireZoneID {
        let object = try self.object(json ?? .null, path)
        return WireZoneID(zoneName: try string(object["zoneName"], path + ".zoneName"),
                          ownerRecordName: try string(object["ownerRecordName"], path + ".ownerRecordName"))
    }
}

/// One item of a batch answer about records (`records/modify`, `records/lookup`, `deltas/push`): the record
/// as the server holds it (CloudKit's record dictionary, or a short form with `fieldsOmitted`; a
/// `deltas/push` item holds `recordChangeTag`, `position` and `upToDate`), or the error of that record alone.
public struct RecordAnswer: Sendable {
    public var recordName: String
    public var result: Result<[String: JSON], ServiceError>

    /// A record; its `recordName` names the item.
    public init(record: [String: JSON]) {
        recordName = record["recordName"]?.stringValue ?? ""
        result = .success(record)
    }

    public init(recordName: String, error: ServiceError) {
        self.recordName = recordName
        result = .failure(error)
    }

    /// An error item when it has `serverErrorCode`, else a record.
    public init(json: JSON, path: String, operation: String) throws(AnswerError) {
        let reader = AnswerReader(operation: operation)
        let object = try reader.object(json, path)
        recordName = try reader.string(object["recordName"], path + ".recordName")
        if let error = ServiceError(json: json, itemKey: "recordName") { result = .failure(error) }
        else { result = .success(object) }
    }

    public var record: [String: JSON]? { try? result.get() }

    public var error: ServiceError? {
        if case .failure(let error) = result { return error }
        return nil
    }

    public var json: JSON {
        switch result {
        case .success(let record): return .object(record)
        case .failure(let error): return error.json(item: (key: "recordName", value: recordName))
        }
    }
}

/// `{"records": [item, ...]}`, the answers of `records/modify`, `records/lookup` and `deltas/push`.
func decodeRecordAnswers(_ json: JSON, operation: String) throws(AnswerError) -> [RecordAnswer] {
    let reader = AnswerReader(operation: operation)
    let items = try reader.array(try reader.object(json, "answer")["records"], "records")
    var answers: [RecordAnswer] = []
    for (index, item) in items.enumerated() {
        answers.append(try RecordAnswer(json: item, path: "records[\(index)]", operation: operation))
    }
    return answers
}

/// The answer of `records/modify`: an item per operation, in order.
public struct RecordsModifyResponse: Sendable {
    public var records: [RecordAnswer]

    public init(records: [RecordAnswer]) { self.records = records }
    public init(json: JSON) throws(AnswerError) { records = try decodeRecordAnswers(json, operation: "records/modify") }
    public var json: JSON { .object(["records": .array(records.map(\.json))]) }
}

/// The answer of `records/lookup`: an item per name asked, in order (NOT_FOUND for a missing record).
public struct RecordsLookupResponse: Sendable {
    public var records: [RecordAnswer]

    public init(records: [RecordAnswer]) { self.records = records }
    public init(json: JSON) throws(AnswerError) { records = try decodeRecordAnswers(json, operation: "records/lookup") }
    public var json: JSON { .object(["records": .array(records.map(\.json))]) }
}

/// The JSON answer of `deltas/push`: an item per record of the delta, in the delta's (name) order.
public struct DeltasPushResponse: Sendable {
    public var records: [RecordAnswer]

    public init(records: [RecordAnswer]) { self.records = records }
    public init(json: JSON) throws(AnswerError) { records = try decodeRecordAnswers(json, operation: "deltas/push") }
    public var json: JSON { .object(["records": .array(records.map(\.json))]) }
}

/// The answer of `records/query`: a page of records and, when more match, the marker of the next page.
public struct RecordsQueryResponse: Sendable, Hashable {
    public var records: [[String: JSON]]
    public var continuationMarker: String?

    public init(records: [[String: JSON]], continuationMarker: String? = nil) {
        self.records = records
        self.continuationMarker = continuationMarker
    }

    public init(json: JSON) throws(AnswerError) {
        let reader = AnswerReader(operation: "records/query")
        let object = try reader.object(json, "answer")
        var records: [[String: JSON]] = []
        for (index, item) in try reader.array(object["records"], "records").enumerated() {
            records.append(try reader.object(item, "records[\(index)]"))
        }
        self.records = records
        continuationMarker = try object["continuationMarker"].map { json throws(AnswerError) in
            try reader.string(json, "continuationMarker")
        }
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("records", JSON.array(records.map(JSON.object)))
        writer.set("continuationMarker", continuationMarker)
        return writer.json
    }
}

/// The answer of `users/current`: who the token belongs to.
public struct UsersCurrentResponse: Sendable, Hashable {
    public var userRecordName: String
    public var name: String

    public init(userRecordName: String, name: String) {
        self.userRecordName = userRecordName
        self.name = name
    }

    /// A missing `name` reads as empty.
    public init(json: JSON) throws(AnswerError) {
        let reader = AnswerReader(operation: "users/current")
        let object = try reader.object(json, "answer")
        userRecordName = try reader.string(object["userRecordName"], "userRecordName")
        name = object["name"]?.stringValue ?? ""
    }

    public var json: JSON { .object(["userRecordName": .string(userRecordName), "name": .string(name)]) }
}
