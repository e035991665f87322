//! Sans-I/O MQTT codec: being built.
