"""djl_handlers.request"""
