"""djl_handlers.server"""
