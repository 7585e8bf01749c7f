//! Desks: a durable workspace bound to one agent identity (see DESIGN.md, "Desks").
