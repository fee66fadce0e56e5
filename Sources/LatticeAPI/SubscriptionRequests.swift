import LatticeCore

/// `subscriptions/modify`, `subscriptions/list`, `subscriptions/lookup` (CloudKit Web Services' subscription
/// dictionary, with `"database"` for CKDatabaseSubscription and Lattice's `webhook`), and the push tokens of
/// `tokens/create` and `tokens/register`.

/// What fires a query subscription.
public enum SubscriptionEvent: String, Sendable, Hashable, CaseIterable {
    case create
    case update
    case delete

    /// Its bit in `StoredSubscription.firesOn`.
    public var bit: Int64 {
        switch self {
        case .create: 1
        case .update: 2
        case .delete: 4
        }
    }
}

/// A subscription as the API reads and answers it.
public struct WireSubscription: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable, CaseIterable {
        case query
        case zone
        case database
    }

    public var subscriptionID: String
    public var subscriptionType: Kind
    /// A zone subscription's zone; a query subscription's, unless `zoneWide`.
    public var zoneID: WireZoneID?
    /// A query subscription over every zone of the database.
    public var zoneWide: Bool
    /// A query subscription's record type and filters (`records/query`'s `filterBy`, ANDed).
    public var recordType: String?
    public var filters: [RecordQueryFilter]
    /// A query subscription's events; every one when left out.
    public var firesOn: Set<SubscriptionEvent>
    /// A query subscription fires once, then is deleted.
    public var firesOnce: Bool
    /// Kept and answered as given (CloudKit's alert and badge settings; Lattice sends no alerts).
    public var notificationInfo: JSON?
    /// Lattice: POST each change to this URL (`webhook: {"url": ...}`).
    public var webhookURL: String?

    public init(subscriptionID: String, subscriptionType: Kind, zoneID: WireZoneID? = nil, zoneWide: Bool = false,
                recordType: String? = nil, filters: [RecordQueryFilter] = [],
                firesOn: Set<SubscriptionEvent> = Set(SubscriptionEvent.allCases), firesOnce: Bool = false,
                notificationInfo: JSON? = nil, webhookURL: String? = nil) {
        self.subscriptionID = subscriptionID
        self.subscriptionType = subscriptionType
        self.zoneID = zoneID
        self.zoneWide = zoneWide
        self.recordType = recordType
        self.filters = filters
        self.firesOn = firesOn
        self.firesOnce = firesOnce
        self.notificationInfo = notificationInfo
        self.webhookURL = webhookURL
    }

    /// The longest `subscriptionID`, in UTF-8 bytes.
    public static let maximumIDBytes = 255
    /// The longest webhook URL, in bytes.
    public static let maximumURLBytes = 2_048
    /// The largest `notificationInfo`, serialized.
    public static let maximumNotificationInfoBytes = 4_096

    /// Reads `subscription` at `path`; `requireDefinition` false reads only the id (a delete).
    /// - Throws: BAD_REQUEST naming the member, LIMIT_EXCEEDED for too many filters or values.
    public init(json: JSON, path: String, limits: RequestLimits, requireDefinition: Bool = true) throws(ServiceError) {
        guard let object = json.objectValue else { throw ServiceError.badRequest("\(path) must be an object") }
        guard let id = object["subscriptionID"]?.stringValue, !id.isEmpty, id.utf8.count <= Self.maximumIDBytes,
              !id.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw ServiceError.badRequest("\(path).subscriptionID must be a string of 1 to \(Self.maximumIDBytes) bytes "
                                          + "without control characters")
        }
        self.init(subscriptionID: id, subscriptionType: .database)
        guard requireDefinition else { return }
        guard let typeName = object["subscriptionType"]?.stringValue, let kind = Kind(rawValue: typeName) else {
            throw ServiceError.badRequest("\(path).subscriptionType must be one of query, zone, database")
        }
        subscriptionType = kind
        if let wide = object["zoneWide"] {
            guard let flag = wide.boolValue else { throw ServiceError.badRequest("\(path).zoneWide must be a boolean") }
            zoneWide = flag
        } else {
            zoneWide = false
        }
        if let once = object["firesOnce"] {
            guard let flag = once.boolValue else { throw ServiceError.badRequest("\(path).firesOnce must be a boolean") }
            firesOnce = flag
        } else {
            firesOnce = false
        }
        if let events = object["firesOn"] {
            guard let list = events.arrayValue, !list.isEmpty, list.count <= 3 else {
                throw ServiceError.badRequest("\(path).firesOn must be a list of create, update, delete")
            }
            var set: Set<SubscriptionEvent> = []
            for (index, item) in list.enumerated() {
                guard let name = item.stringValue, let event = SubscriptionEvent(rawValue: name) else {
                    throw ServiceError.badRequest("\(path).firesOn[\(index)] must be create, update or delete")
                }
                set.insert(event)
            }
            firesOn = set
        } else {
            firesOn = Set(SubscriptionEvent.allCases)
        }
        if let info = object["notificationInfo"] {
            guard info.objectValue != nil else { throw ServiceError.badRequest("\(path).notificationInfo must be an object") }
            guard info.serializedBytes().count <= Self.maximumNotificationInfoBytes else {
                throw ServiceError(.limitExceeded, "\(path).notificationInfo is over \(Self.maximumNotificationInfoBytes) bytes")
            }
            notificationInfo = info
        } else {
            notificationInfo = nil
        }
        if let hook = object["webhook"] {
            guard let url = hook["url"]?.stringValue, hook.objectValue?.count == 1 else {
                throw ServiceError.badRequest("\(path).webhook must be {\"url\": \"https://...\"}")
            }
            guard url.utf8.count <= Self.maximumURLBytes, url.hasPrefix("https://") || url.hasPrefix("http://") else {
                throw ServiceError.badRequest("\(path).webhook.url must be an http:// or https:// URL of at most "
                                              + "\(Self.maximumURLBytes) bytes")
            }
            webhookURL = url
        } else {
            webhookURL = nil
        }
        zoneID = try object["zoneID"].map { zone throws(ServiceError) in try WireZoneID(json: zone, path: path + ".zoneID") }
        recordType = nil
        filters = []
        switch kind {
        case .database:
            guard zoneID == nil, !zoneWide, object["query"] == nil else {
                throw ServiceError.badRequest("\(path): a database subscription takes no zoneID, zoneWide or query")
            }
            guard object["firesOn"] == nil, !firesOnce else {
                throw ServiceError.badRequest("\(path): firesOn and firesOnce belong to query subscriptions")
            }
        case .zone:
            guard zoneID != nil else { throw ServiceError.badRequest("\(path).zoneID is missing") }
            guard !zoneWide, object["query"] == nil else {
                throw ServiceError.badRequest("\(path): a zone subscription takes no zoneWide or query")
            }
            guard object["firesOn"] == nil, !firesOnce else {
                throw ServiceError.badRequest("\(path): firesOn and firesOnce belong to query subscriptions")
            }
        case .query:
            guard zoneWide == (zoneID == nil) else {
                throw ServiceError.badRequest("\(path): a query subscription names a zoneID or is zoneWide, not both")
            }
            guard let query = object["query"]?.objectValue else { throw ServiceError.badRequest("\(path).query is missing") }
            guard let type = query["recordType"]?.stringValue, !type.isEmpty else {
                throw ServiceError.badRequest("\(path).query.recordType is missing")
            }
            guard query["sortBy"] == nil else {
                throw ServiceError.badRequest("\(path).query.sortBy has no meaning in a subscription")
            }
            recordType = type
            if let filterJSON = query["filterBy"] {
                guard let list = filterJSON.arrayValue else {
                    throw ServiceError.badRequest("\(path).query.filterBy must be an array")
                }
                guard list.count <= limits.maximumQueryFilters else {
                    throw ServiceError(.limitExceeded, "\(path).query.filterBy has \(list.count) filters; the limit is "
                                       + "\(limits.maximumQueryFilters)")
                }
                for (index, item) in list.enumerated() {
                    filters.append(try RecordQueryFilter(json: item, path: "\(path).query.filterBy[\(index)]",
                                                         maximumValues: limits.maximumFilterValues))
                }
            }
        }
    }

    /// CloudKit's dictionary (with `webhook` when set; never its secret).
    public var json: JSON {
        var writer = RequestWriter()
        writer.set("subscriptionID", subscriptionID)
        writer.set("subscriptionType", subscriptionType.rawValue)
        writer.set("zoneID", zoneID?.json)
        if subscriptionType == .query {
            var query = RequestWriter()
            query.set("recordType", recordType)
            if !filters.isEmpty { query.set("filterBy", JSON.array(filters.map(\.json))) }
            writer.set("query", query.json)
            writer.set("zoneWide", zoneWide)
            writer.set("firesOn", SubscriptionEvent.allCases.filter(firesOn.contains).map(\.rawValue))
            writer.set("firesOnce", firesOnce)
        }
        writer.set("notificationInfo", notificationInfo)
        if let webhookURL { writer.set("webhook", JSON.object(["url": .string(webhookURL)])) }
        return writer.json
    }
}

/// `subscriptions/modify {"operations": [{"operationType": "create" | "update" | "delete", "subscription"}]}`.
public struct SubscriptionsModifyRequest: Sendable, Hashable {
    public enum OperationType: String, Sendable, Hashable, CaseIterable {
        case create
        case update
        case delete
    }

    public struct Operation: Sendable, Hashable {
        public var operationType: OperationType
        public var subscription: WireSubscription

        public init(_ operationType: OperationType, _ subscription: WireSubscription) {
            self.operationType = operationType
            self.subscription = subscription
        }
    }

    public var operations: [Operation]

    public init(operations: [Operation]) { self.operations = operations }

    /// Each operation in order; the first malformed one is the answer (nothing is written).
    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        let items = try RequestReader(json).items("operations", limit: limits.maximumOperations)
        var operations: [Operation] = []
        for (index, item) in items.enumerated() {
            let path = "operations[\(index)]"
            guard let name = item["operationType"]?.stringValue, let type = OperationType(rawValue: name) else {
                throw ServiceError.badRequest("\(path).operationType must be one of create, update, delete")
            }
            guard let subscription = item["subscription"] else { throw ServiceError.badRequest("\(path).subscription is missing") }
            operations.append(Operation(type, try WireSubscription(json: subscription, path: path + ".subscription",
                                                                   limits: limits, requireDefinition: type != .delete)))
        }
        self.operations = operations
    }

    public var json: JSON {
        .object(["operations": .array(operations.map { operation in
            .object(["operationType": .string(operation.operationType.rawValue),
                     "subscription": operation.operationType == .delete
                         ? .object(["subscriptionID": .string(operation.subscription.subscriptionID)])
                         : operation.subscription.json])
        })])
    }
}

/// `subscriptions/lookup {"subscriptions": [{"subscriptionID"}]}`.
public struct SubscriptionsLookupRequest: Sendable, Hashable {
    public var subscriptionIDs: [String]

    public init(subscriptionIDs: [String]) { self.subscriptionIDs = subscriptionIDs }

    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        let items = try RequestReader(json).items("subscriptions", limit: limits.maximumResultsLimit)
        var ids: [String] = []
        for (index, item) in items.enumerated() {
            ids.append(try WireSubscription(json: item, path: "subscriptions[\(index)]", limits: limits,
                                            requireDefinition: false).subscriptionID)
        }
        subscriptionIDs = ids
    }

    public var json: JSON {
        .object(["subscriptions": .array(subscriptionIDs.map { .object(["subscriptionID": .string($0)]) })])
    }
}

/// `tokens/create {"apnsEnvironment"}` (CloudKit's push token) and `tokens/register {"apnsEnvironment",
/// "apnsToken"}`.
public struct PushTokenRequest: Sendable, Hashable {
    public var apnsEnvironment: String
    /// `tokens/register`'s token; nil for `tokens/create`.
    public var apnsToken: String?

    public init(apnsEnvironment: String, apnsToken: String? = nil) {
        self.apnsEnvironment = apnsEnvironment
        self.apnsToken = apnsToken
    }

    /// Whether a `tokens/create` body asks for a push token (it names `apnsEnvironment`), as CloudKit's does;
    /// a body without it is the bearer-token request `tokens/issue` took over.
    public static func isPushTokenRequest(_ json: JSON) -> Bool { json["apnsEnvironment"] != nil }

    public init(json: JSON, requireToken: Bool) throws(ServiceError) {
        guard let environment = json["apnsEnvironment"]?.stringValue,
              environment == "development" || environment == "production" else {
            throw ServiceError.badRequest("apnsEnvironment must be development or production")
        }
        apnsEnvironment = environment
        if requireToken {
            guard let token = json["apnsToken"]?.stringValue, !token.isEmpty, token.utf8.count <= 256 else {
                throw ServiceError.badRequest("apnsToken must be the token tokens/create answered")
            }
            apnsToken = token
        } else {
            apnsToken = nil
        }
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("apnsEnvironment", apnsEnvironment)
        writer.set("apnsToken", apnsToken)
        return writer.json
    }
}
