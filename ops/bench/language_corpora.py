"""Small corpora of an agent collective's memory in four languages, each experience with
queries that name it in other words or other forms of its words: the recall test
(``tests/test_languages.py``) and the recall benchmark (``ops.bench.languages``) read
them. Every query shares with its experience the meaning, rarely a word form: Ukrainian
and German queries inflect the words differently (cases, numbers, verb forms), German
ones also split or join compounds and drop umlauts' inflection (Häuser, Haus); Chinese
ones say the same thing in other characters' order and company."""

from __future__ import annotations

# language -> [(experience, [queries that should find it in the top 3])]
CORPORA: dict[str, list[tuple[str, list[str]]]] = {
    "ukrainian": [
        ("Публікацію статті відкладено: сервер бази даних не відповідав під час розгортання.",
         ["публікації відкладені", "публікація статей", "база даних не відповідає"]),
        ("Помилку авторизації виправлено оновленням токенів доступу для агентів.",
         ["помилки авторизації", "оновити токен доступу"]),
        ("Кешування відповідей зменшило навантаження на сервери пошуку вдвічі.",
         ["навантаження серверів пошуку", "кешуванням відповіді"]),
        ("Міграцію схеми таблиць треба запускати до оновлення застосунку.",
         ["міграції схем", "таблиця схема міграція"]),
        ("Черга повідомлень переповнилася, бо споживачі не встигали обробляти події.",
         ["черги повідомлення", "споживач події"]),
        ("Резервні копії зберігаються у сховищі щоночі та перевіряються відновленням.",
         ["резервних копій", "сховища копія"]),
        ("Тести інтеграції падали через застарілі залежності в образі контейнера.",
         ["тестів інтеграції", "залежність контейнерів"]),
        ("Користувачі скаржилися на повільне завантаження сторінок після релізу.",
         ["користувачів скарги", "завантаженням сторінки"]),
        ("Журнал подій показав витік пам'яті в обробнику вебхуків.",
         ["витоку пам'яті", "обробників вебхук"]),
        ("Ключі шифрування ротуються щомісяця адміністратором безпеки.",
         ["ключів шифруванням", "адміністратори безпеки"]),
    ],
    "german": [
        ("Die Datenbankverbindung brach während der Bereitstellung ab.",
         ["Verbindung zur Datenbank", "Datenbankverbindungen abgebrochen"]),
        ("Fehlerhafte Zertifikate verhinderten den Zugriff auf die Schnittstelle.",
         ["Zertifikatsfehler", "Schnittstellenzugriff verhindert"]),
        ("Die Speicherauslastung der Suchknoten stieg nach dem Update stark an.",
         ["Auslastung des Speichers", "Suchknoten"]),
        ("Benutzerkonten werden nach drei fehlgeschlagenen Anmeldungen gesperrt.",
         ["gesperrtes Benutzerkonto", "fehlgeschlagene Anmeldung"]),
        ("Die Übersetzungen der Oberfläche wurden für österreichische Nutzer überarbeitet.",
         ["Übersetzung der Oberflächen", "überarbeitete Übersetzung"]),
        ("Warteschlangen liefen über, weil die Verbraucher zu langsam waren.",
         ["Warteschlange", "langsamer Verbraucher"]),
        ("Die nächtlichen Sicherungen werden im Objektspeicher abgelegt.",
         ["nächtliche Sicherung", "Objektspeichers"]),
        ("Die Ladezeiten der Seiten verschlechterten sich nach dem Release.",
         ["Ladezeit der Seite", "verschlechterte Ladezeit"]),
        ("Schlüssel für die Verschlüsselung werden monatlich gewechselt.",
         ["Verschlüsselungsschlüssel", "monatlicher Schlüsselwechsel"]),
        ("Die Kühlung der Häuser im Rechenzentrum fiel im Sommer aus.",
         ["Haus Kühlung", "Rechenzentren Kühlungen"]),
    ],
    "chinese": [
        ("数据库连接在部署期间中断了", ["部署时数据库中断", "数据库连接"]),
        ("用户登录失败是因为令牌过期", ["令牌过期导致登录失败", "登录失败"]),
        ("缓存响应使搜索服务器的负载减少了一半", ["服务器负载", "缓存 搜索"]),
        ("表结构迁移必须在应用更新之前运行", ["迁移表结构", "应用更新前迁移"]),
        ("消息队列溢出，因为消费者处理太慢", ["队列溢出", "消费者太慢"]),
        ("备份每晚存储在对象存储中并通过恢复验证", ["每晚备份", "对象存储 恢复"]),
        ("集成测试因为容器镜像中的依赖过时而失败", ["容器依赖过时", "集成测试失败"]),
        ("发布后用户抱怨页面加载缓慢", ["页面加载慢", "用户抱怨"]),
        ("事件日志显示网络钩子处理程序存在内存泄漏", ["内存泄漏", "网络钩子"]),
        ("加密密钥每月由安全管理员轮换", ["密钥轮换", "安全管理员"]),
    ],
    "english": [
        ("Publishing the article was postponed: the database server did not answer "
         "during deployment.",
         ["postponed publications", "database servers answering"]),
        ("Fixed the authorization error by refreshing the agents' access tokens.",
         ["authorization errors", "refresh access token"]),
        ("Caching responses halved the load on the search servers.",
         ["cached response", "search server loads"]),
        ("Schema migrations of the tables must run before the application is updated.",
         ["migrating table schemas", "application updates"]),
        ("The message queue overflowed because consumers could not keep up with events.",
         ["queues overflowing", "consumer events"]),
        ("Backups are stored in object storage nightly and verified by restoring them.",
         ["nightly backup", "restored backups verified"]),
        ("Integration tests failed because of outdated dependencies in the container image.",
         ["failing integration test", "container images dependency"]),
        ("Users complained about slow page loads after the release.",
         ["user complaints", "slow loading pages"]),
        ("The event log showed a memory leak in the webhook handler.",
         ["memory leaks", "webhook handlers"]),
        ("Encryption keys are rotated monthly by the security administrator.",
         ["rotating encryption key", "security administrators"]),
    ],
}  # fmt: skip
